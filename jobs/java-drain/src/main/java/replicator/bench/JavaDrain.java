package replicator.bench;

import com.couchbase.client.dcp.Client;
import com.couchbase.client.dcp.StreamFrom;
import com.couchbase.client.dcp.StreamTo;
import com.couchbase.client.dcp.config.CompressionMode;
import com.couchbase.client.dcp.highlevel.CollectionCreated;
import com.couchbase.client.dcp.highlevel.CollectionDropped;
import com.couchbase.client.dcp.highlevel.CollectionFlushed;
import com.couchbase.client.dcp.highlevel.DatabaseChangeListener;
import com.couchbase.client.dcp.highlevel.Deletion;
import com.couchbase.client.dcp.highlevel.FlowControlMode;
import com.couchbase.client.dcp.highlevel.Mutation;
import com.couchbase.client.dcp.highlevel.ScopeCreated;
import com.couchbase.client.dcp.highlevel.ScopeDropped;
import com.couchbase.client.dcp.highlevel.SeqnoAdvanced;
import com.couchbase.client.dcp.highlevel.SnapshotDetails;
import com.couchbase.client.dcp.highlevel.StreamEnd;
import com.couchbase.client.dcp.highlevel.StreamFailure;
import com.couchbase.client.dcp.message.StreamEndReason;
import java.lang.management.ManagementFactory;
import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The reference drain: Couchbase's own DCP client streams every vbucket from 0 to its current
 * high seqno and counts what it receives, as replicator.bench.drain does with DcpClient.
 *
 * <p>Arguments: host:port bucket user window-bytes timeout-seconds; the password comes from the
 * REPLICATOR_BENCH_PASSWORD environment variable (never on a command line). Prints one JSON line:
 * messages (markers, items, system events, stream ends), documents, key and body bytes, and the
 * wall and process CPU seconds from the start of streaming to the last stream end.
 */
public final class JavaDrain {
  public static void main(String[] args) throws Exception {
    if (args.length != 5) {
      System.err.println("usage: JavaDrain host:port bucket user window-bytes timeout-seconds");
      System.exit(2);
    }
    String password = System.getenv("REPLICATOR_BENCH_PASSWORD");
    if (password == null) {
      System.err.println("set REPLICATOR_BENCH_PASSWORD to the user's password");
      System.exit(2);
    }
    Client client =
        Client.builder()
            .seedNodes(args[0])
            .bucket(args[1])
            .credentials(args[2], password)
            .flowControl(Integer.parseInt(args[3]))
            .collectionsAware(true) // every collection, as DcpClient streams them
            .compression(CompressionMode.ENABLED)
            .build();
    AtomicLong messages = new AtomicLong();
    AtomicLong documents = new AtomicLong();
    AtomicLong bytes = new AtomicLong();
    AtomicReference<String> failure = new AtomicReference<>();
    CountDownLatch ended = new CountDownLatch(1);
    AtomicInteger open = new AtomicInteger(Integer.MAX_VALUE); // set once the map is known
    client.listener(
        new DatabaseChangeListener() {
          @Override
          public void onMutation(Mutation mutation) {
            // Touch the key and the (decompressed) body: the Python drain decodes both.
            bytes.addAndGet(mutation.getKey().length() + mutation.getContent().length);
            documents.incrementAndGet();
            messages.incrementAndGet();
          }

          @Override
          public void onDeletion(Deletion deletion) {
            bytes.addAndGet(deletion.getKey().length());
            documents.incrementAndGet();
            messages.incrementAndGet();
          }

          @Override
          public void onSnapshot(SnapshotDetails snapshot) {
            messages.incrementAndGet();
          }

          // Counted as messages, as the Python drain counts them: markers, items, system events.
          @Override
          public void onSeqnoAdvanced(SeqnoAdvanced advanced) {
            messages.incrementAndGet();
          }

          @Override
          public void onScopeCreated(ScopeCreated event) {
            messages.incrementAndGet();
          }

          @Override
          public void onScopeDropped(ScopeDropped event) {
            messages.incrementAndGet();
          }

          @Override
          public void onCollectionCreated(CollectionCreated event) {
            messages.incrementAndGet();
          }

          @Override
          public void onCollectionDropped(CollectionDropped event) {
            messages.incrementAndGet();
          }

          @Override
          public void onCollectionFlushed(CollectionFlushed event) {
            messages.incrementAndGet();
          }

          @Override
          public void onStreamEnd(StreamEnd end) {
            messages.incrementAndGet();
            if (end.getReason() != StreamEndReason.OK) {
              failure.compareAndSet(null, "vbucket " + end.getVbucket() + " ended " + end.getReason());
              ended.countDown();
            }
            if (open.decrementAndGet() == 0) {
              ended.countDown();
            }
          }

          @Override
          public void onFailure(StreamFailure streamFailure) {
            failure.compareAndSet(null, "vbucket " + streamFailure.getVbucket() + ": " + streamFailure.getCause());
            ended.countDown();
          }
        },
        FlowControlMode.AUTOMATIC);
    client.connect().block(Duration.ofSeconds(60));
    client.initializeState(StreamFrom.BEGINNING, StreamTo.NOW).block(Duration.ofSeconds(60));
    open.set(client.numPartitions());
    var os = (com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean();
    long cpuStarted = os.getProcessCpuTime();
    long wallStarted = System.nanoTime();
    client.startStreaming().block(Duration.ofSeconds(60));
    boolean done = ended.await(Long.parseLong(args[4]), TimeUnit.SECONDS);
    double seconds = (System.nanoTime() - wallStarted) / 1e9;
    double cpuSeconds = (os.getProcessCpuTime() - cpuStarted) / 1e9;
    client.disconnect().block(Duration.ofSeconds(30));
    if (!done) {
      failure.compareAndSet(null, "drain incomplete after " + args[4] + " s");
    }
    String error = failure.get();
    System.out.printf(
        "{\"messages\": %d, \"documents\": %d, \"bytes\": %d, \"seconds\": %.6f, \"cpu_seconds\": %.6f, \"error\": %s}%n",
        messages.get(), documents.get(), bytes.get(), seconds, cpuSeconds,
        error == null ? "null" : "\"" + error.replace("\\", "\\\\").replace("\"", "'") + "\"");
    System.exit(error == null ? 0 : 1);
  }
}
