"""Redis, the cache of directives and hot sets, split by stage: ``topology`` (one
server, Sentinel or Cluster: the clients), ``wire`` and ``cluster_wire`` (the request
path's own read client), ``sentinel`` (the master's address), ``hot_record`` (the hot
set's record format), ``write_marks`` (each agent's last write's WAL position, for the
read routing); ``cache`` composes them into ``RedisContextCache``. Driver errors leave
as ``errors.CacheError``. The names most callers need are re-exported here.
"""

from ibex_context.stores.redis.cache import RedisContextCache, create_redis_client
from ibex_context.stores.redis.topology import RedisTopology
from ibex_context.stores.redis.write_marks import WriteMarks

__all__ = ["RedisContextCache", "RedisTopology", "WriteMarks", "create_redis_client"]
