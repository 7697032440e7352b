"""Replicator: mirror a Couchbase bucket into Delta Lake through DCP."""
