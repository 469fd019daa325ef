"""Watch streams: one JSON event per line, from the store's event history."""

import json
import time

from errors import status_body


def _line(etype, obj_json):
    return ('{"type":"%s","object":%s}\n' % (etype, obj_json)).encode()


def serve_watch(write, store, rtype, sel, params, bookmark_interval, encode, client_gone=lambda: False):
    """Streams events to write(bytes) until timeout, a dropped-watch request,
    an expired start RV, shutdown, the client leaving (client_gone(), polled
    about once a second) or a write failure (an exception).
    encode(obj, event_or_None) -> JSON text of the object to send."""
    rv_param = params.get("resourceVersion")
    bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
    send_initial = params.get("sendInitialEvents") == "true"
    try:
        timeout = float(params.get("timeoutSeconds") or 1800)
    except ValueError:
        timeout = 1800
    deadline = time.monotonic() + timeout
    with store.lock:
        epoch = store.watch_epoch
        store.open_watches += 1

    def bookmark(rv, initial_end=False):
        meta = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": rtype.kind, "apiVersion": rtype.api_version, "metadata": meta}
        write(_line("BOOKMARK", json.dumps(obj)))

    def expired_event():
        body = status_body(410, "Expired", "too old resource version: %s (%s)" % (rv_param, store.oldest_rv))
        write(_line("ERROR", json.dumps(body)))

    try:
        if rv_param in (None, "", "0") or send_initial:
            objs, rv = store.snapshot(rtype, sel)
            for o in objs:
                write(_line("ADDED", encode(o, None)))
            if send_initial and bookmarks:
                bookmark(rv, initial_end=True)
            next_rv = rv + 1
        else:
            try:
                n = int(rv_param)
            except ValueError:
                write(_line("ERROR", json.dumps(status_body(400, "BadRequest", "invalid resourceVersion"))))
                return
            with store.lock:
                if store.expired_since(n):
                    expired_event()
                    return
            next_rv = n + 1
        next_bookmark = time.monotonic() + bookmark_interval
        last_poll = time.monotonic()
        while True:
            with store.lock:
                while True:
                    if store.watch_epoch != epoch or store.closing:
                        return
                    if store.rv >= next_rv:
                        break
                    now = time.monotonic()
                    until = min(deadline, next_bookmark) if bookmarks else deadline
                    until = min(until, last_poll + 1.0)
                    if now >= until:
                        break
                    store.cond.wait(until - now)
                if store.rv >= next_rv and next_rv < store.first_event_rv:
                    expired_event()
                    return
                events = store.events_from(next_rv) if store.rv >= next_rv else []
                next_rv = store.rv + 1
            for ev in events:
                if ev.skey != rtype.skey:
                    continue
                if ev.type == "MODIFIED":
                    was, now_in = sel.matches(ev.old), sel.matches(ev.obj)
                    if not was and not now_in:
                        continue
                    etype = "MODIFIED" if was and now_in else ("ADDED" if now_in else "DELETED")
                else:
                    if not sel.matches(ev.obj):
                        continue
                    etype = ev.type
                write(_line(etype, encode(ev.obj, ev)))
            now = time.monotonic()
            if now >= deadline:
                return
            if now >= last_poll + 1.0:
                last_poll = now
                if client_gone():
                    return
            if bookmarks and now >= next_bookmark:
                bookmark(next_rv - 1)
                next_bookmark = now + bookmark_interval
    finally:
        with store.lock:
            store.open_watches -= 1
