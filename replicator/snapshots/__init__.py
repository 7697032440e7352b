"""Snapshot assembly and staging: typed events in, complete snapshots out, bounded memory."""
