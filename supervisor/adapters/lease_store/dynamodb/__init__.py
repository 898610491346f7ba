"""The lease store on DynamoDB, one job per module:

- ``client``: boto3's low-level client; the one request path (worker thread, capacity limiter,
  request counts, metrics) that maps botocore's errors to the store's, once;
- ``codec``: items <-> AttributeValues (pure), on the table's contract
  (``shard_worker.contract.table``: keys, attribute names, the fenced release);
- ``admin``: create the table, add the ``roster`` index to an older one, wait until ACTIVE;
  protocol 2's indexes, meta item, backfill and flip (``init-table --protocol``);
- ``store``: ``DynamoLeaseStore``, the lease operations, each a thin composition of the above;
- ``fleet``: ``DynamoFleet`` (``DynamoLeaseStore.fleet()``), protocol 2's requests.
"""

from supervisor.adapters.lease_store.dynamodb.admin import ROSTER_INDEX, roster_index_definition
from supervisor.adapters.lease_store.dynamodb.store import DynamoLeaseStore

__all__ = ["ROSTER_INDEX", "DynamoLeaseStore", "roster_index_definition"]
