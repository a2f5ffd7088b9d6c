"""A TVM RPC server for the emulated environment (zen.compiled.emulation): run by the emulated Python, by path.

    python3.11 emulated_server.py PORT

Why not `python -m tvm.exec.rpc_server`: it serves each session in a worker process started from
`sys.executable`, and an emulated binary cannot be exec'd on a host without binfmt_misc (which zen does not
install). This serves the same protocol (TVM's handshake, then `ServerLoop` on the socket) in its own process,
one session after another, on loopback only. It imports TVM and the standard library, nothing of zen's.
"""

import socket
import struct
import sys


def main(port: int) -> None:
    from tvm.rpc import _ffi_api, base
    from tvm.rpc.server import _server_env

    env = _server_env(None)  # uploads go to its temporary directory; kept for the life of the server
    listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind(("127.0.0.1", port))
    listen.listen(1)
    print("READY", flush=True)  # the parent waits for this line: a probe connection would be a session
    while True:
        conn, _ = listen.accept()
        try:
            if struct.unpack("<i", base.recvall(conn, 4))[0] != base.RPC_MAGIC:
                raise OSError("not a TVM RPC client")
            keylen = struct.unpack("<i", base.recvall(conn, 4))[0]
            if not 0 <= keylen <= 4096:
                raise OSError(f"a key of {keylen} bytes")
            base.recvall(conn, keylen)
            key = b"server:zen-emulated"
            conn.sendall(struct.pack("<i", base.RPC_CODE_SUCCESS) + struct.pack("<i", len(key)) + key)
        except (OSError, struct.error, RuntimeError):
            conn.close()
            continue
        _ffi_api.ServerLoop(conn.detach())  # the loop closes the descriptor when the session ends
    del env


if __name__ == "__main__":
    main(int(sys.argv[1]))
