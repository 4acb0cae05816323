import os

from spark_sink import create_session, read_outbox_events
from spark_sink.schema_registry import confluent_payload, confluent_schema_id, json_value

spark = create_session()
kafka = os.environ.get("OUTBOX_BOOTSTRAP_SERVERS", "localhost:9092")
events = read_outbox_events(spark, bootstrap_servers=kafka, topics=["orders"])
orders = events.select(
    "transaction_id",
    confluent_schema_id().alias("schema_id"),
    json_value("id LONG, total DOUBLE").alias("order"),  # JSONSerializer values
    confluent_payload().alias("document"),  # the bytes after the frame, for any decoder
    # AvroSerializer values, with the spark-avro package on the classpath:
    # from_avro(confluent_payload(), ORDER_AVRO_SCHEMA), from pyspark.sql.avro.functions
)
orders.printSchema()  # a streaming frame: start it with orders.writeStream
spark.stop()
