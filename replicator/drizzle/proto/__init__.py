"""Drizzle's replication messages, compiled from the .proto files beside this module."""
