import json
import os

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import StringSerializer

from outbox import LocalTransactionState, Message, TransactionProducer

ORDER_SCHEMA = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "double"}],
    }
)


class SaveOrder:
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        print("saving", message.value)  # the typed value, as given: a dict here
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.ROLLBACK_MESSAGE  # look the order up in your database


# new_client: a mock:// URL gives confluent-kafka's in-memory registry, to try without one
url = os.environ.get("SCHEMA_REGISTRY_URL", "mock://order-service")  # http://registry:8081
registry = SchemaRegistryClient.new_client({"url": url})
with TransactionProducer(
    "order-service",
    SaveOrder(),
    key_serializer=StringSerializer("utf_8"),
    value_serializer=AvroSerializer(registry, ORDER_SCHEMA),
) as producer:
    result = producer.send_message_in_transaction(
        Message("orders", {"id": 7, "total": 12.5}, key="7")
    )
print(result.end_status, "schema id:", registry.get_latest_version("orders-value").schema_id)
