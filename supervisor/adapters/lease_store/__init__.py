"""The lease store: its interface (``base``), the in-memory twin and DynamoDB."""
