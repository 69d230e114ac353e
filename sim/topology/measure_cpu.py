"""Measure this host for the cpu-local device profile and topology:

    OPENBLAS_NUM_THREADS=1 python -m sim.topology.measure_cpu

sgemm GFLOP/s of one core (numpy), memcpy GB/s of one and of all cores, TCP loopback latency and
stream bandwidth between two processes. The figures go into topologies/devices/cpu-local.yaml and
topologies/cpu-local.yaml by hand (with the date and host).
"""
import os, socket, time, multiprocessing as mp
import numpy as np

def gemm(n=4096, reps=5):
    a = np.random.rand(n, n).astype(np.float32); b = np.random.rand(n, n).astype(np.float32)
    a @ b
    return max(2 * n**3 / _t(lambda: a @ b) for _ in range(reps)) / 1e9

def _t(f):
    t = time.perf_counter(); f(); return time.perf_counter() - t

def copy_gbps(nbytes=256 << 20, reps=10):
    x = np.ones(nbytes // 8); y = np.empty_like(x)
    return max(x.nbytes / _t(lambda: np.copyto(y, x)) for _ in range(reps)) / 1e9

def _copy_worker(q):
    q.put(copy_gbps())

def tcp_server(port, nbytes, q):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port)); s.listen(1); c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    # ping-pong latency
    for _ in range(2000):
        c.recv(1); c.sendall(b"x")
    buf = bytearray(4 << 20); got = 0
    while got < nbytes:
        got += c.recv_into(buf)
    c.sendall(b"d"); c.close(); s.close()

def tcp_client(port, nbytes):
    c = socket.create_connection(("127.0.0.1", port)); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    t = time.perf_counter()
    for _ in range(2000):
        c.sendall(b"x"); c.recv(1)
    rtt = (time.perf_counter() - t) / 2000
    data = b"\0" * (4 << 20); t = time.perf_counter(); sent = 0
    while sent < nbytes:
        c.sendall(data); sent += len(data)
    c.recv(1); bw = nbytes / (time.perf_counter() - t) / 1e9
    return rtt / 2 * 1e9, bw

if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    print("sgemm fp32 4096^3 (threads=%s): %.1f GFLOP/s" % (os.environ.get("OPENBLAS_NUM_THREADS"), gemm()))
    print("memcpy one process: %.2f GB/s copied" % copy_gbps())
    q = mp.Queue(); ps = [mp.Process(target=_copy_worker, args=(q,)) for _ in range(os.cpu_count())]
    [p.start() for p in ps]; [p.join() for p in ps]
    r = [q.get() for _ in ps]; print("memcpy %d processes at once: %s GB/s each, %.2f total" % (len(r), [round(v, 2) for v in r], sum(r)))
    nbytes = 2 << 30
    srv = mp.Process(target=tcp_server, args=(29517, nbytes, None)); srv.start(); time.sleep(0.5)
    lat_ns, bw = tcp_client(29517, nbytes); srv.join()
    print("TCP loopback: one-way latency %.0f ns, stream %.2f GB/s" % (lat_ns, bw))
