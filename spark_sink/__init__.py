"""PySpark Structured Streaming over the real topics: committed events into a table."""
