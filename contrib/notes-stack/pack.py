#!/usr/bin/python3
# pack.py ROOTFS OUT : two docker-save tarballs, OUT with "IMG" replaced by
# each image's name (pgdb, notes), over one layer made of ROOTFS.
import hashlib, io, json, os, subprocess, sys, tarfile, tempfile
rootfs, out = sys.argv[1], sys.argv[2]
tmp = tempfile.mkdtemp(dir="/tmp")
layer = os.path.join(tmp, "layer.tar")
subprocess.run(["tar", "--numeric-owner", "-C", rootfs, "-cf", layer, "."], check=True)
h = hashlib.sha256()
with open(layer, "rb") as f:
    for b in iter(lambda: f.read(1 << 20), b""): h.update(b)
diff = "sha256:" + h.hexdigest()
def config(cfg):
    return json.dumps({"architecture": "amd64", "os": "linux", "config": cfg,
                       "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
images = {
    "pgdb": {"User": "postgres", "Cmd": ["/db-entrypoint.sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
             "ExposedPorts": {"5432/tcp": {}}, "Volumes": {"/var/lib/postgresql/data": {}}, "StopSignal": "SIGINT", "WorkingDir": "/var/lib/postgresql"},
    "notes": {"User": "www-data", "Cmd": ["/app/app.py"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONUNBUFFERED=1"],
              "ExposedPorts": {"8080/tcp": {}}, "WorkingDir": "/app"},
}
for name, cfg in images.items():
    c = config(cfg); cid = hashlib.sha256(c).hexdigest()
    with tarfile.open(out.replace("IMG", name), "w") as t:
        def add(n, data):
            ti = tarfile.TarInfo(n); ti.size = len(data); t.addfile(ti, io.BytesIO(data))
        add(cid + ".json", c)
        t.add(layer, "layer0/layer.tar")
        add("manifest.json", json.dumps([{"Config": cid + ".json", "RepoTags": [name + ":latest"], "Layers": ["layer0/layer.tar"]}]).encode())
os.remove(layer); os.rmdir(tmp)
