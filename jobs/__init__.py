"""Spark jobs: entry points for spark-submit."""
