import os
import queue

from flask import Flask, request

from http_semaphore.receiver import Grant, ReceiverError, verify

app = Flask(__name__)
TOKEN = os.environ["SEMAPHORE_TOKEN"]  # the token given to pool.enqueue
grants: queue.Queue[Grant] = queue.Queue()  # for a worker: it holds the slot till it's done
taken: set[tuple[int, int]] = set()  # (ticket, fence) of every grant taken


@app.post("/granted")
def granted() -> tuple[str, int]:
    try:
        grant = verify(request.headers, request.get_data(), TOKEN)
    except ReceiverError as refused:
        return refused.message, refused.status  # 401 or 400: the ticket fails
    if (grant.ticket, grant.fence) not in taken:  # else a duplicate: 2xx again, taken once
        taken.add((grant.ticket, grant.fence))
        grants.put(grant)
    return "", 204
