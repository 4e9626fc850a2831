"""The timeline page's HTML: one file, its CSS and script inline, opened with no network.

The lanes and bars are written here as HTML, every value through :func:`html.escape`;
the details a click shows come from the model embedded as JSON in a
``<script type="application/json">`` block (``<``, ``>`` and ``&`` escaped as ``\\u003c``…,
so no stored text can end the block) and are put on the page by the script with
``textContent`` only, never as markup. A Content-Security-Policy lets only the page's own
script run (a nonce) and forbids every network request.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import quote

__all__ = ["page", "page_name"]

_BAR_ERROR = 160  # characters of an error written on its bar (the details show it whole)
_ROW = 84.0  # percent of a lane the longest attempt's timed bars fill (the rest: fixed-width bars, gaps)


def page_name(thread_id: str) -> str:
    """The file name a thread's page gets by default: fork links point at these names. An id
    whose quoted form would pass a file system's 255-byte name limit is shortened, with a
    digest of the whole id so that two long ids never share a page."""
    name = quote(thread_id, safe="")
    if len(name) > 200:
        digest = hashlib.blake2b(thread_id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
        cut = name[:180]
        if "%" in cut[-2:]:  # not in the middle of an escape
            cut = cut[: cut.rindex("%")]
        name = f"{cut}-{digest}"
    return name + ".html"


def _link(thread_id: str) -> str:
    return escape(quote(page_name(thread_id), safe=""))


def _e(value: Any) -> str:
    return escape("" if value is None else str(value))


def duration(seconds: float | None) -> str:
    """A duration for people: ``—`` when unknown."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def page(m: dict[str, Any]) -> str:
    """The whole document for the model ``m`` (``_timeline.model``)."""
    nonce = secrets.token_urlsafe(18)
    data = json.dumps(m, ensure_ascii=False, separators=(",", ":"), default=str)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    data = data.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    title = f"Timeline of thread {m['thread']}"
    # One time scale for every lane: the attempt that took longest fills its row.
    attempts = [a["bars"] for r in m["runs"] for a in r["attempts"]] + [m["outside"]]
    top = max((sum(_timed(b) for b in bars) for bars in attempts), default=0.0) or 1.0
    csp = f"default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{nonce}'; base-uri 'none'; form-action 'none'"
    return "".join([
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<meta http-equiv=\"Content-Security-Policy\" content=\"{csp}\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        _header(m),
        "<main><section id=\"lanes\" aria-label=\"runs\">",
        _outside(m["outside"], top),
        "".join(_run(r, top) for r in m["runs"]),
        "</section><aside id=\"details\" aria-live=\"polite\"><p class=\"hint\">Click a step to see its "
        "arguments digest, result, error, and the state at its checkpoint with the changes from the "
        "previous one.</p></aside></main>",
        f"<script type=\"application/json\" id=\"pk-data\">{data}</script>",
        f"<script nonce=\"{nonce}\">{_JS}</script></body></html>\n",
    ])


def _header(m: dict[str, Any]) -> str:
    out = [f"<header><h1>Thread <code>{_e(m['thread'])}</code></h1><p class=\"meta\">"]
    meta = [f"store {_e(m['store'])}"]
    if m["namespace"]:
        meta.append(f"namespace <code>{_e(m['namespace'])}</code>")
    runs = len(m["runs"])
    meta.append(f"{runs} run{'s' if runs != 1 else ''}, {m['shown']} checkpoint{'s' if m['shown'] != 1 else ''}")
    meta.append(f"written {_e(m['generated'])}")
    out.append(" · ".join(meta) + "</p>")
    if m["total"] is not None:
        out.append(f"<p class=\"note\">A long thread: the newest {m['shown']:,} of its {m['total']:,} "
                   "checkpoints are shown; older runs are left out, and the oldest run shown may start "
                   "before its first bar.</p>")
    src = m["forked_from"]
    if src:
        out.append(f"<p class=\"fork\" id=\"forked-from\">Forked from thread <a href=\"{_link(src['thread'])}\">"
                   f"<code>{_e(src['thread'])}</code></a> at checkpoint <code>{_e(src['checkpoint'])}</code></p>")
    if m["forks"]:
        links = ", ".join(
            f"<a href=\"{_link(f['thread'])}\"><code>{_e(f['thread'])}</code></a> (from checkpoint "
            f"<code>{_e(f['checkpoint'])}</code>)" for f in m["forks"]
        )
        out.append(f"<p class=\"fork\" id=\"forks\">Forked from this thread: {links}</p>")
    if m["forks_limited"]:
        out.append(f"<p class=\"note\">Forks of this thread were looked for in {m['forks_scanned']:,} other "
                   "threads of the store only (the first ones, up to a bound on the rows read).</p>")
    lease = m.get("lease")
    if lease:
        out.append(_lease(lease))
    if m.get("children"):
        out.append(f"<div class=\"children\" id=\"children\">Child runs (now): {_children(m['children'])}</div>")
    out.append("<p class=\"legend\">" + "".join(
        f"<span class=\"key st-{k}\">{k}</span>" for k in ("ran", "replayed", "retried", "failed", "suspended", "answered")
    ) + "<span class=\"key resume-key\">resumed after a crash</span><span class=\"key fx-key\">after-commit effects</span>"
        "<span class=\"hint\">A step's duration is the time since the previous record of its attempt "
        "(— for an attempt's first step, unless it was resumed: nothing records when an attempt starts). "
        "Replayed steps write nothing: they are the steps an attempt replays from its earlier attempts.</span></p></header>")
    return "".join(out)


def _children(kids: list[dict[str, Any]]) -> str:
    """The tree of child runs (pk.start): who started each, its agent, thread and status."""
    items = "".join(
        f"<li>at <code>{_e(k['position'])}</code> of run <code>{_e(k['parent_run_id'][:12])}</code>: "
        f"<code>{_e(k['agent'])}</code> on thread <code>{_e(k['thread_id'])}</code> "
        f"<span class=\"st\">{_e(k['status'])}</span>{_children(k['children']) if k['children'] else ''}</li>"
        for k in kids
    )
    return f"<ul>{items}</ul>"


def _lease(lease: dict[str, Any]) -> str:
    """The thread's lease when the page was written: the run holding it, the turns waiting."""
    parts = []
    if lease["holder"]:
        parts.append(f"held by a live run in <code>{_e(lease['holder'])}</code> (until {_e(_when(lease['expires']))})")
    else:
        parts.append("free")
    if lease["reserved_for"]:
        parts.append(f"reserved for unfinished run <code>{_e(lease['reserved_for'][:12])}</code>: only its "
                     "redelivery may take it, the turns after it wait")
    waiting = lease["waiting"]
    if waiting:
        who = ", ".join(f"<code>{_e(w)}</code>" for w in waiting)
        parts.append(f"{len(waiting)} turn{'s' if len(waiting) != 1 else ''} waiting behind it: {who}")
    return f"<p class=\"lease\" id=\"lease\">Lease (now): {' · '.join(parts)}</p>"


def _outside(bars: list[dict[str, Any]], top: float) -> str:
    if not bars:
        return ""
    return ("<div class=\"run\" id=\"outside\"><h2>Outside runs <span class=\"sub\">forks and state updates"
            "</span></h2>" + _attempt("", bars, top) + "</div>")


def _run(r: dict[str, Any], top: float) -> str:
    attempts = r["attempts"]
    n = len(attempts)
    head = (f"<h2>Run <code title=\"{_e(r['run'])}\">{_e(r['run'][:12])}</code> "
            f"<span class=\"rs rs-{_e(r['status'])}\">{_e(r['status'])}</span>"
            f"<span class=\"sub\">{n} attempt{'s' if n != 1 else ''}</span></h2>")
    body = "".join(_resumed(a.get("resumed")) + _attempt(
        f"attempt {a['n']} · {a['ended']}" + (f" · resumed in {a['resumed']['host']}" if a.get("resumed") else ""),
        a["bars"], top, a["resumed"]["t"] if a.get("resumed") else None) for a in attempts)
    return f"<div class=\"run\" id=\"run-{_e(r['run'])}\">{head}{body}</div>"


def _resumed(mark: dict[str, Any] | None) -> str:
    """The line between two attempts where a block continued an unfinished run (``rz``)."""
    if not mark:
        return ""
    return (f"<div class=\"resume\" role=\"note\" title=\"{_e(_when(mark['t']))}\">"
            f"<span class=\"mark\" aria-hidden=\"true\">\u26a1</span> {_e(mark['text'])}</div>")


def _timed(b: dict[str, Any]) -> float:
    """The seconds a bar stands for on the time scale (0: drawn at its fixed width)."""
    return 0.0 if b["dur"] is None or b["status"] == "replayed" else float(b["dur"])


def _attempt(label: str, bars: list[dict[str, Any]], top: float, start: float | None = None) -> str:
    # A step failing ends its attempt with the same error: the end bar need not repeat it.
    failed = {b["error"] for b in bars if b["status"] == "failed"}
    cells = []
    for b in bars:
        shown = {**b, "error": None} if b["status"].startswith("run ") and b["error"] in failed else b
        cells.append(_bar(shown, _ROW * _timed(b) / top))
    first = start or (bars[0]["t"] if bars else None)  # a resumed attempt: when it was resumed
    when = f" · {_when(first)}" if first else ""
    lab = f"<div class=\"label\">{_e(label)}{_e(when)}</div>" if label else ""
    return f"<div class=\"attempt\">{lab}<div class=\"bars\">{''.join(cells)}</div></div>"


def _bar(b: dict[str, Any], width: float) -> str:
    """One step's button; ``width``: percent of the lane (0: the narrowest bar)."""
    status = str(b["status"])
    cls = "st-" + status.replace(" ", "-")
    tip = [f"{b['name']}" + (f" at {b['pos']}" if b.get("pos") else ""), status, duration(b["dur"])]
    if b.get("retries"):
        tip.append(f"{b['retries']} earlier failure{'s' if b['retries'] != 1 else ''} here")
    if b.get("error"):
        tip.append(str(b["error"]))
    parts = [f"<span class=\"name\">{_e(b['name'])}</span>",
             f"<span class=\"st\">{_e(status)}</span>"]
    if status != "replayed":
        parts.append(f"<span class=\"dur\">{_e(duration(b['dur']))}</span>")
    if b.get("retries"):
        parts.append(f"<span class=\"retries\">retry {b['retries']}</span>")
    fx = b.get("effects")
    if fx:
        left = fx["n"] - fx["done"]
        state = "done" if not left else f"{left} pending"
        parts.append(f"<span class=\"fx\">\u21b3 {fx['n']} after-commit · {_e(state)}</span>")
        tip.append(f"after-commit effects ({state}): {', '.join(fx['names'])}")
    if b.get("error"):
        err = str(b["error"])
        parts.append(f"<span class=\"err\">{_e(err if len(err) <= _BAR_ERROR else err[:_BAR_ERROR] + '…')}</span>")
    src = f" data-from=\"{_e(b['from'])}\"" if b.get("from") else ""
    style = f" style=\"flex:0 1 {width:.2f}%\"" if width else ""  # shrinks to fit the lane, down to min-width
    return (f"<button type=\"button\" class=\"bar {_e(cls)}\" data-c=\"{_e(b['c'])}\" data-status=\"{_e(status)}\"{src}"
            f"{style} title=\"{_e(' · '.join(tip))}\">{''.join(parts)}</button>")


_CSS = """
:root{--ran:#2f7d4f;--replayed:#9aa3ad;--retried:#b7791f;--failed:#c53030;--suspended:#6b46c1;--answered:#2b6cb0;--end:#4a5568}
*{box-sizing:border-box}body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1a202c;background:#f7f8fa}
header{padding:14px 20px;background:#fff;border-bottom:1px solid #e2e8f0}h1{font-size:19px;margin:0 0 4px}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
.meta,.note,.fork{margin:2px 0;color:#4a5568}.note{color:#975a16}
.legend{margin:8px 0 0}.key{display:inline-block;margin-right:8px;padding:1px 8px;border-radius:9px;color:#fff;font-size:12px}
main{display:flex;gap:16px;padding:16px 20px;align-items:flex-start}
#lanes{flex:3;min-width:0}#details{flex:2;min-width:300px;max-width:46%;background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:12px 16px;position:sticky;top:12px;max-height:calc(100vh - 24px);overflow:auto}
.run{background:#fff;border:1px solid #e2e8f0;border-radius:8px;padding:10px 12px;margin-bottom:12px}
.run h2{font-size:15px;margin:0 0 6px}.sub{font-weight:normal;color:#718096;font-size:12px;margin-left:8px}
.rs{font-size:12px;padding:1px 8px;border-radius:9px;background:#e2e8f0;margin-left:6px}
.rs-completed{background:#c6f6d5}.rs-failed{background:#fed7d7}.rs-suspended{background:#e9d8fd}.rs-unfinished{background:#feebc8}
.attempt{margin:6px 0}.label{font-size:12px;color:#718096;margin-bottom:3px}
.bars{display:flex;gap:3px;align-items:stretch;flex-wrap:wrap;padding:4px;margin:-4px}
.bar{flex:0 0 92px;min-width:92px;text-align:left;border:0;border-radius:5px;padding:5px 7px;color:#fff;cursor:pointer;font:inherit;font-size:12px;display:flex;flex-direction:column;gap:1px;overflow:hidden}
.bar:focus-visible,.bar.sel{outline:3px solid #2d3748;outline-offset:1px}
.bar .name{font-weight:600;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}.bar .st,.bar .dur,.bar .retries{opacity:.92}
.bar .err{background:rgba(0,0,0,.18);border-radius:3px;padding:1px 4px;white-space:normal;word-break:break-word}
.st-ran,.key.st-ran{background:var(--ran)}.st-retried,.key.st-retried{background:var(--retried)}.st-failed,.key.st-failed{background:var(--failed)}
.st-suspended,.key.st-suspended{background:var(--suspended)}.st-answered,.key.st-answered{background:var(--answered)}
.st-replayed,.key.st-replayed{background:repeating-linear-gradient(135deg,#a0aec0 0 6px,#b8c2cc 6px 12px);color:#1a202c;min-width:70px;flex:0 0 70px}
.bar[class*="st-run"],.st-fork,.st-update{background:var(--end)}.st-run-failed{background:#742a2a}.st-run-completed{background:#22543d}
#details h2{font-size:16px;margin:0 0 6px}#details h3{font-size:13px;margin:14px 0 4px;color:#2d3748;text-transform:uppercase;letter-spacing:.04em}
#details dl{display:grid;grid-template-columns:auto 1fr;gap:2px 10px;margin:0}#details dt{color:#718096}#details dd{margin:0;word-break:break-all}
#details pre{background:#f7fafc;border:1px solid #edf2f7;border-radius:5px;padding:6px 8px;margin:4px 0;white-space:pre-wrap;word-break:break-word;max-height:320px;overflow:auto}
#details pre.error{background:#fff5f5;border-color:#fed7d7;color:#9b2c2c}.op{font-weight:600}.op-added,.op-appended{color:#276749}.op-removed{color:#9b2c2c}.op-changed{color:#975a16}
.resume{margin:8px 0 4px;padding:4px 8px;border-left:4px solid #c05621;background:#fffaf0;color:#7b341e;font-size:12.5px;border-radius:0 5px 5px 0}
.resume-key{background:#c05621}.fx-key{background:#2c7a7b}.bar .fx{background:rgba(255,255,255,.22);border-radius:3px;padding:0 4px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.lease{margin:4px 0;color:#2c5282}
.hint{color:#718096}.legend .hint{display:block;margin-top:6px;font-size:12px}.ch{margin:8px 0 2px;font-weight:600}
"""

_JS = r"""
(function(){
"use strict";
var data=JSON.parse(document.getElementById("pk-data").textContent);
var panel=document.getElementById("details");
function el(tag,text,cls){var e=document.createElement(tag);if(text!==undefined&&text!==null)e.textContent=String(text);if(cls)e.className=cls;return e;}
function val(i){return (i===undefined||i===null)?"":data.values[i];}
function when(t){return t?new Date(t*1000).toISOString().replace("T"," ").replace(/\.\d+Z$/," UTC"):"—";}
function pre(text,cls){return el("pre",text,cls);}
function show(bar){
  var c=data.checkpoints[bar.getAttribute("data-c")];if(!c)return;
  var sel=document.querySelectorAll(".bar.sel");for(var i=0;i<sel.length;i++)sel[i].classList.remove("sel");
  bar.classList.add("sel");
  panel.textContent="";
  var status=bar.getAttribute("data-status");
  panel.appendChild(el("h2",(c.step||c.kind)+(c.pos?"  ·  "+c.pos:"")+"  ·  "+status));
  if(bar.hasAttribute("data-from"))panel.appendChild(el("p","Replayed in this attempt: a replay writes nothing, so this is the record it replays, written by an earlier attempt.","hint"));
  var dl=el("dl");
  function row(k,v){dl.appendChild(el("dt",k));dl.appendChild(el("dd",v===null||v===undefined||v===""?"—":v));}
  row("checkpoint",c.id);row("run",c.run);row("kind",c.kind);row("step status",c.status);row("run status",c.rs);
  row("written",when(c.t));row("duration",bar.querySelector(".dur")?bar.querySelector(".dur").textContent:"—");
  row("arguments digest",c.args);
  panel.appendChild(dl);
  if(c.forked_from){panel.appendChild(el("h3","Forked from"));panel.appendChild(pre("thread "+c.forked_from.thread+"\ncheckpoint "+c.forked_from.checkpoint));}
  if(c.error){panel.appendChild(el("h3","Error"));panel.appendChild(pre(c.error,"error"));}
  if(c.question!==null&&c.question!==undefined){panel.appendChild(el("h3","Question"));panel.appendChild(pre(val(c.question)));}
  if(c.result!==null&&c.result!==undefined){panel.appendChild(el("h3","Result"));panel.appendChild(pre(val(c.result),"result"));}
  var st=el("section");st.id="state";st.appendChild(el("h3","State at this checkpoint"));
  var names=Object.keys(c.state);
  if(!names.length)st.appendChild(el("p","(empty)","hint"));
  names.forEach(function(n){st.appendChild(el("div",n,"ch"));st.appendChild(pre(val(c.state[n]),"value"));});
  panel.appendChild(st);
  var d=c.diff,df=el("section");df.id="diff";
  df.appendChild(el("h3","Changes from the previous checkpoint"));
  if(d.base===null){df.appendChild(el("p",d.note,"hint"));}
  else{
    df.appendChild(el("p","previous: "+d.base,"hint"));
    if(!d.changes.length)df.appendChild(el("p","no change","hint"));
    d.changes.forEach(function(x){
      var h=el("div",null,"ch");h.appendChild(document.createTextNode(x.ch+" "));
      var what=x.op==="appended"?"appended "+x.n+" item"+(x.n===1?"":"s"):x.op;
      h.appendChild(el("span",what,"op op-"+x.op));df.appendChild(h);
      if(x.keys){var k=[];["added","removed","changed"].forEach(function(w){if(x.keys[w].length)k.push(w+": "+x.keys[w].join(", "));});if(k.length)df.appendChild(el("p","keys "+k.join("; "),"hint"));}
      if(x.op==="changed"){df.appendChild(el("div","before","hint"));df.appendChild(pre(val(x.old)));df.appendChild(el("div","after","hint"));df.appendChild(pre(val(x.new)));}
      else if(x.op==="removed"){df.appendChild(pre(val(x.old)));}
      else{df.appendChild(pre(val(x.new)));}
    });
    if(d.unchanged.length)df.appendChild(el("p","unchanged: "+d.unchanged.join(", "),"hint"));
  }
  panel.appendChild(df);
}
document.getElementById("lanes").addEventListener("click",function(ev){
  var t=ev.target;while(t&&t!==this&&!(t.classList&&t.classList.contains("bar")))t=t.parentNode;
  if(t&&t!==this){show(t);try{history.replaceState(null,"","#c="+t.getAttribute("data-c"));}catch(e){}}
});
var m=/^#c=([0-9a-z]+)$/.exec(location.hash);  /* a link to one step: THREAD.html#c=<checkpoint id> */
if(m){var b=document.querySelector('.bar[data-c="'+m[1]+'"]');if(b)show(b);}
})();
"""
