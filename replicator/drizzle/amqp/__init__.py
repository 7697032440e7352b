"""Drizzle Transaction messages over AMQP 0-9-1 (RabbitMQ), as RabbitReplication carried them.

One message body is one serialized `Transaction` (a whole transaction, or one segment of a bulk
one). The producer side publishes them to a durable queue, persistent and confirmed; the replica
side consumes with manual acknowledgements and acknowledges only what it has committed:

- `AmqpSource` (source): where the queue is, parsed from
  `drizzle+amqp://[USER[:PASSWORD]@]HOST[:PORT]/QUEUE` with the vhost as an optional query
  parameter (`?vhost=NAME`, default `/`).
- `TransactionPublisher` (publisher): declares the queue durable and publishes bodies with
  publisher confirms, each confirmed before `publish` returns (the broker has it on disk).
- `TransactionConsumer` (consumer): hands out `Delivery`s (a tag and a body) and acknowledges
  nothing until told, through `ack_through(tag)` (one cumulative ack). Whatever is
  unacknowledged when the connection goes comes back after `connect()` with `redelivered` set;
  the assembler recognises those by transaction and segment id (`MessageSkipped`).

Delivery tags only grow over a consumer's life, across reconnects: the broker numbers each
channel's deliveries from 1 again, so a tag handed out before a reconnect would name a different
message on the new channel. The consumer adds an offset instead, and a tag from a closed
connection acknowledges nothing (its message was redelivered under a new tag). That makes a tag a
position the assembler can keep (`feed(message, position=delivery.delivery_tag)`): acknowledge
through `oldest_open_position() - 1` (or the last tag, when nothing is open) once everything
completed before it is committed.

After a reconnect, restart assembly from what was finished,
`TransactionAssembler(completed=assembler.completed_ids())`: every segment of a transaction
that was open comes back under a new tag, while its old first position would acknowledge
nothing, and a window full of unacknowledgeable redeliveries would stall the stream.

The password never appears in a log line, an error, `repr` or `str` of these objects: errors name
the host, port, vhost, queue and user.

Opening a connection, and what the broker's refusals mean, are in connection; the errors, each
naming the broker and the vhost, queue or user at fault, in errors.
"""
