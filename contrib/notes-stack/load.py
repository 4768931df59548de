#!/usr/bin/python3
# load.py URL SECONDS WORKERS OUT: each worker posts a note, reads it back,
# opens a new connection every few requests; records every acked id and
# every error.
import http.client, json, sys, threading, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1]); secs = float(sys.argv[2]); W = int(sys.argv[3]); out = sys.argv[4]
acked, errors, lat = [], [], []
lock = threading.Lock()
stop = time.time() + secs
def worker(w):
    conn = None; k = 0
    while time.time() < stop:
        k += 1
        if conn is None or k % 5 == 0:
            if conn: conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        body = "w%d-%d" % (w, k)
        t0 = time.time()
        try:
            conn.request("POST", "/notes", body=body)
            r = conn.getresponse(); d = r.read()
            if r.status != 201: raise Exception("POST %d %s" % (r.status, d[:80]))
            i = json.loads(d)["id"]
            conn.request("GET", "/notes/%d" % i)
            r = conn.getresponse(); d = r.read()
            if r.status != 200 or json.loads(d)["body"] != body: raise Exception("GET %d %s" % (r.status, d[:80]))
            with lock: acked.append((i, body)); lat.append(time.time() - t0)
        except Exception as e:
            with lock: errors.append("%.3f %r" % (time.time(), e))
            conn.close(); conn = None
ts = [threading.Thread(target=worker, args=(w,)) for w in range(W)]
[t.start() for t in ts]; [t.join() for t in ts]
json.dump({"acked": acked, "errors": errors, "max_latency_s": max(lat) if lat else 0, "requests": len(lat)}, open(out, "w"))
print("acked %d errors %d max latency %.3f s" % (len(acked), len(errors), max(lat) if lat else 0))
