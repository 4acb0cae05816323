import os

from spark_sink import read_outbox_events
from spark_sink.session import create_session  # a session with the connector on its classpath

spark = create_session()  # local[*]; or your own session (see "On a cluster")
kafka = os.environ.get("OUTBOX_BOOTSTRAP_SERVERS", "localhost:9092")
events = read_outbox_events(spark, kafka, topics=["orders", "payments"])  # streaming
history = read_outbox_events(spark, kafka, pattern=r"orders\..*", streaming=False)
events.printSchema()  # the columns below
spark.stop()
