"""The embedded Redis fallback: fakeredis' pure-Python TCP server (Lua through lupa), run as its own process.

Used by the demo sandbox when no ``redis-server`` binary is on PATH. It runs in a separate process (not a thread of
the demo) so that the workers' BRPOP/pub-sub traffic does not compete with the console for the GIL, and so that it
is torn down like every other part of the sandbox (its own process group).

    python -m celeryops.demo.fakeserver --port 6390     # prints "ready 127.0.0.1:6390" once it accepts connections
"""

from __future__ import annotations

import argparse
import sys
import threading

from celeryops.demo.stopsignal import until_signalled


def serve(host: str, port: int) -> None:
    """Serve until SIGTERM/SIGINT; prints one ``ready HOST:PORT`` line once the socket listens."""
    from fakeredis import TcpFakeServer

    server = TcpFakeServer((host, port), server_type="redis")
    # Handler threads must not keep the process alive once the server is told to stop.
    server.daemon_threads = True
    stop = until_signalled()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
    thread.start()
    actual = server.server_address[1]
    sys.stdout.write(f"ready {host}:{actual}\n")
    sys.stdout.flush()
    stop()
    server.shutdown()
    server.server_close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m celeryops.demo.fakeserver", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    serve(args.host, args.port)


if __name__ == "__main__":
    main()
