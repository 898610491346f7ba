"""Development tools (reference feed, demo, local DynamoDB, sink audit), not for production."""
