"""The read side: questions asked of a mirror without writing to it."""
