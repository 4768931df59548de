#!/usr/bin/python3
# A small notes service: Python's threading HTTP server in front of
# PostgreSQL through a pool of persistent connections.
import json, os, re, sys, time
import psycopg2, psycopg2.pool
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler

host = os.environ["DB_HOST"]
for i in range(60):
    try:
        pool = psycopg2.pool.ThreadedConnectionPool(2, 16, host=host, user="app", dbname="app", connect_timeout=5)
        break
    except psycopg2.OperationalError as e:
        print("waiting for the database:", e, file=sys.stderr, flush=True)
        time.sleep(1)
else:
    sys.exit("database at %s unreachable for 60 s" % host)
c = pool.getconn()
with c, c.cursor() as cur:
    cur.execute("create table if not exists notes (id serial primary key, body text not null)")
pool.putconn(c)

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def q(self, sql, args=()):
        c = pool.getconn()
        try:
            with c, c.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchone()
        finally:
            pool.putconn(c)
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        (i,) = self.q("insert into notes (body) values (%s) returning id", (body,))
        self.reply(201, {"id": i})
    def do_GET(self):
        if self.path == "/count":
            (n,) = self.q("select count(*) from notes")
            return self.reply(200, {"count": n})
        m = re.fullmatch(r"/notes/(\d+)", self.path)
        if not m:
            return self.reply(404, {"error": "no such path"})
        row = self.q("select body from notes where id = %s", (int(m.group(1)),))
        self.reply(200 if row else 404, {"body": row[0] if row else None})
    def reply(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass

ThreadingHTTPServer.daemon_threads = True
# socketserver's default backlog is 5: a burst of new connections then
# overflows the accept queue, and a client can see a reset.
ThreadingHTTPServer.request_queue_size = 128
ThreadingHTTPServer(("0.0.0.0", 8080), H).serve_forever()
