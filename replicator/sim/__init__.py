"""The embedded DCP producer: a simulated Couchbase bucket served over real TCP."""
