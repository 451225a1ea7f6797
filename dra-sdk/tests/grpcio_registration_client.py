"""Plays the kubelet's side of plugin registration with Python grpcio.

Usage: grpcio_registration_client.py <registration socket path>

grpcio, like the kubelet's grpc-go dialer, sends the percent-encoded socket
path as the HTTP/2 :authority of a `unix:` target, so this is an independent
check of the SDK's :authority rewriting. It calls GetInfo, then
NotifyRegistrationStatus(plugin_registered=true), and prints the raw
PluginInfo message as hex on stdout. Any RPC failure exits non-zero with the
gRPC status on stderr.
"""

import sys

import grpc


def main() -> int:
    socket_path = sys.argv[1]
    # No serializers: requests and responses are raw protobuf bytes, so no
    # generated stubs are needed.
    with grpc.insecure_channel(f"unix:{socket_path}") as channel:
        get_info = channel.unary_unary("/pluginregistration.Registration/GetInfo")
        notify = channel.unary_unary(
            "/pluginregistration.Registration/NotifyRegistrationStatus"
        )
        try:
            info = get_info(b"", timeout=5)
            # RegistrationStatus{plugin_registered: true}: field 1, varint 1.
            notify(b"\x08\x01", timeout=5)
        except grpc.RpcError as error:
            print(f"{error.code()}: {error.details()}", file=sys.stderr)
            return 1
    print(info.hex())
    return 0


if __name__ == "__main__":
    sys.exit(main())
