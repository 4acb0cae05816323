import os

from spark_sink import create_session, read_outbox_events

spark = create_session()  # the Kafka connector on its classpath; local[*], or see "On a cluster"
kafka = os.environ.get("OUTBOX_BOOTSTRAP_SERVERS", "localhost:9092")
events = read_outbox_events(spark, kafka, topics=["orders", "payments"])  # streaming
history = read_outbox_events(spark, kafka, pattern=r"orders\..*", streaming=False)
events.printSchema()  # the columns below
spark.stop()
