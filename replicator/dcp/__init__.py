"""DCP protocol layer: wire codec, connections, streams, cluster map. Knows nothing of Delta."""
