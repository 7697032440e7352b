"""The Delta layer: mirror table, group commits, checkpoints, failover logs, rollback."""
