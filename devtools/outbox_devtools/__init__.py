"""Local runtimes for development, tests, the demo and the benchmarks.

A real Apache Kafka broker from the official jars and a throwaway PostgreSQL
cluster, both started as plain local processes, for machines without Docker.
"""
