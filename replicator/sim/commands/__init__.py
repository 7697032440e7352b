"""A simulated node's answers to client requests: one connection's protocol state machine.

`CommandProcessor` (processor) holds what a connection negotiated (HELLO features, the
authenticated user, the selected bucket, DCP_OPEN flags and controls, open streams) and answers
each request as kv_engine does: bootstrap commands (HELLO, SASL, SELECT_BUCKET, VERSION ...:
handshake), bucket queries (GET_CLUSTER_CONFIG, GET_ALL_VB_SEQNOS, failover logs ...:
bucket_queries), then DCP_OPEN, DCP_CONTROL, STREAM_REQ with its rollback decision,
CLOSE_STREAM, BUFFER_ACK (dcp_streams). The negotiated state and the reply helpers they share
are in state. Replies go out through `ConnectionHooks`; moving bytes, flow control and noops
are the session's (replicator.sim.session).
"""
