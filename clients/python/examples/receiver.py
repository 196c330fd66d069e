import os
import queue
import threading

from flask import Flask, request

from http_semaphore.receiver import Grant, ReceiverError, verify

app = Flask(__name__)
TOKEN = os.environ["SEMAPHORE_TOKEN"]  # the token given to pool.enqueue
grants: queue.Queue[Grant] = queue.Queue()  # for a worker: it holds the slot till it's done
taken: set[tuple[int, int]] = set()  # (ticket, fence) of every grant taken
lock = threading.Lock()  # Flask serves requests on threads: check and add at once


@app.post("/granted")
def granted() -> tuple[str, int]:
    try:
        grant = verify(request.headers, request.get_data(), TOKEN)
    except ReceiverError as refused:
        return refused.message, refused.status  # 401 or 400: the ticket fails
    with lock:
        duplicate = (grant.ticket, grant.fence) in taken
        taken.add((grant.ticket, grant.fence))
    if not duplicate:  # a duplicate is answered 2xx again, and not taken twice
        grants.put(grant)
    return "", 204
