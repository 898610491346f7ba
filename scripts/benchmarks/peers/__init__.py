"""The peers measured beside shardvisor: python-dynamodb-lock, supervisord, a bare ``websockets``
loop. The modules run *by* a peer (``lock_client``, ``crasher``, ``ws_client``) import only the
standard library and that peer, as they run under its own virtualenv (out/bench/venv-*)."""
