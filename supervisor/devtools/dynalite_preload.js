// Preloaded into dynalite by supervisor/devtools/servers.py (`node --require`).
//
// dynalite 4.0.0 throws a request's "aborted" error when its client resets the connection in the
// middle of a request, and that uncaught exception ends the whole server, with the tables of every
// test after it (architect/dynalite#183, open). The tests SIGKILL supervisors and children in the
// middle of their requests on purpose; such a request is simply gone, as it would be for DynamoDB.
// Any other uncaught error still ends the server.
'use strict'

process.on('uncaughtException', (err) => {
  if (err && err.code === 'ECONNRESET') {
    console.error(`dynalite: a client reset its request (${err.message}); serving on`)
    return
  }
  console.error(err)
  process.exit(1)
})
