"""Storage layer: DynamoDB adapters for the item store and the queue catalog."""
