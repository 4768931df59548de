#!/usr/bin/python3
# verify.py HOST LOAD.json : every note load.py saw acknowledged reads back
# with its body; exits 1 when one does not.
import json, sys, http.client
d = json.load(open(sys.argv[2])); c = http.client.HTTPConnection(sys.argv[1], 8080, timeout=10); bad = 0
for i, body in d["acked"]:
    c.request("GET", "/notes/%d" % i); r = c.getresponse(); v = json.loads(r.read())
    if r.status != 200 or v["body"] != body: bad += 1
print("checked", len(d["acked"]), "missing or wrong", bad)
sys.exit(1 if bad else 0)
