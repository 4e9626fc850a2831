"""A chat whose answers stream to the browser durably: Server-Sent Events from persistkit streams.

    pip install 'persistkit[sse]'
    python examples/sse_chat.py serve sqlite:///chat.db 8000
    open http://127.0.0.1:8000/                                  # type a question

Each turn runs in a worker process (``python examples/sse_chat.py worker URL THREAD TEXT``,
what a job queue would start), as a durable run: its step ``answer`` emits every token with
``pk.emit``. The page reads ``/stream/THREAD`` with ``EventSource``: ``id:`` is the record's
offset, so a reconnecting browser sends ``Last-Event-ID`` and gets every record after it,
none twice. Kill the worker mid-answer (``kill -9``) and start it again: the new worker
replays what was committed, a ``rewind`` record takes back the dead attempt's tokens, and
the page shows the answer an uncrashed worker would have written (docs/streams.md).
"""

from __future__ import annotations

import subprocess
import sys
import time

import persistkit as pk

HTML = """<!doctype html><meta charset=utf-8><title>persistkit chat</title>
<form id=f><input id=q autofocus placeholder="ask something"><button>send</button></form>
<p id=answer></p><pre id=log></pre>
<script>
const thread = new URLSearchParams(location.search).get("thread") || "demo";
const answer = document.getElementById("answer"), log = document.getElementById("log");
let shown = [];  // [offset, token]: what the page shows, rewinds applied
function render() { answer.textContent = shown.map(s => s[1]).join(""); }
const es = new EventSource("/stream/" + encodeURIComponent(thread));
es.addEventListener("event", e => { const d = JSON.parse(e.data); shown.push([+e.lastEventId, d.data.token || ""]); render(); });
es.addEventListener("rewind", e => { const d = JSON.parse(e.data); shown = shown.filter(s => s[0] <= d.to);
  log.textContent += "rewind to " + d.to + " at " + e.lastEventId + "\\n"; render(); });
es.addEventListener("end", e => { log.textContent += "end " + JSON.parse(e.data).data + "\\n"; document.title = "done"; });
document.getElementById("f").onsubmit = ev => { ev.preventDefault();
  fetch("/chat/" + encodeURIComponent(thread), {method: "POST", body: document.getElementById("q").value}); };
</script>"""

ANSWER = "Durable streams keep what the user saw of an answer , even when the worker dies half way through it ."


def tokens(question: str) -> list[str]:
    """The model's answer, token by token (a stand-in: the same answer every time)."""
    return [w + " " for w in ANSWER.split()]


@pk.checkpointed
def answer(question: str, delay: float) -> str:
    text = ""
    for tok in tokens(question):
        pk.emit({"token": tok})  # readers see it now, before this step commits
        text += tok
        time.sleep(delay)
    return text


def worker(url: str, thread: str, question: str, delay: float = 0.05) -> None:
    """One turn: a durable run. Started again after a crash, it continues the same run."""
    store = pk.connect(url)
    with pk.resume(thread, store=store):
        answer(question, delay)
    store.close()


def app(url: str):  # type: ignore[no-untyped-def]
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, Response, StreamingResponse
    from starlette.routing import Route

    store = pk.connect(url)

    async def page(request: Request) -> Response:
        return HTMLResponse(HTML)

    async def chat(request: Request) -> Response:
        question = (await request.body()).decode()
        subprocess.Popen([sys.executable, __file__, "worker", url, request.path_params["thread"], question])
        return Response(status_code=202)

    async def stream(request: Request) -> Response:
        events = pk.sse(store, request.path_params["thread"], last_event_id=request.headers.get("last-event-id"))
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    return Starlette(routes=[Route("/", page), Route("/chat/{thread}", chat, methods=["POST"]), Route("/stream/{thread}", stream)])


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]) if len(sys.argv) > 5 else 0.05)
    else:
        import uvicorn

        uvicorn.run(app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[3]) if len(sys.argv) > 3 else 8000, log_level="warning")
