"""Escape probes: the network. The sandbox has its own empty network namespace (only `lo`), so
nothing on the host or beyond is reachable; the host checks its listeners got nothing."""

from __future__ import annotations

from escape_probes import Listeners, ProbeRunner, probe_output


def test_host_loopback_tcp_and_udp_listeners_get_nothing(probe: ProbeRunner, listeners: Listeners) -> None:
    result = probe.run(f"""
        import socket
        tcp = socket.socket()
        tcp.settimeout(2)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        report(interfaces=sorted(name for _, name in socket.if_nameindex()),
               tcp=attempt(tcp.connect, ("127.0.0.1", {listeners.tcp_port})),
               tcp_localhost=attempt(socket.create_connection, ("localhost", {listeners.tcp_port}), 2),
               udp=attempt(udp.sendto, b"escaped", ("127.0.0.1", {listeners.udp_port})))
    """)
    out = probe_output(result)
    assert out["interfaces"] == ["lo"]
    # 127.0.0.1 inside is the sandbox's own loopback, where nothing listens.
    assert out["tcp"] in ("ECONNREFUSED", "ENETUNREACH"), out
    assert out["tcp_localhost"] != "ok", out  # no /etc/hosts: not even a name for it
    assert listeners.contacted() == []


def test_host_unix_socket_by_path_is_not_reachable(probe: ProbeRunner, listeners: Listeners) -> None:
    path = listeners.unix_path.getsockname()
    result = probe.run(f"""
        import socket
        client = socket.socket(socket.AF_UNIX)
        report(connect=attempt(client.connect, {path!r}), exists=os.path.exists({path!r}))
    """)
    out = probe_output(result)
    assert out == {"connect": "ENOENT", "exists": False}
    assert listeners.contacted() == []


def test_host_abstract_unix_socket_is_not_reachable(probe: ProbeRunner, listeners: Listeners) -> None:
    # Abstract socket names belong to a network namespace; the host's are invisible inside.
    name = listeners.unix_abstract.getsockname()
    assert isinstance(name, bytes) and name.startswith(b"\0")
    result = probe.run(f"""
        import socket
        client = socket.socket(socket.AF_UNIX)
        names = [line.split()[-1] for line in open("/proc/net/unix").read().splitlines()[1:] if len(line.split()) > 7]
        report(connect=attempt(client.connect, {name!r}), listed=any({name[1:].decode()!r} in n for n in names))
    """)
    out = probe_output(result)
    assert out == {"connect": "ECONNREFUSED", "listed": False}
    assert listeners.contacted() == []


def test_dns_does_not_resolve(probe: ProbeRunner) -> None:
    result = probe.run("""
        import socket
        try:
            socket.getaddrinfo("example.com", 443)
            dns = "resolved"
        except socket.gaierror as error:
            dns = "gaierror"
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        report(dns=dns, resolv_conf=os.path.exists("/etc/resolv.conf"),
               udp_53=attempt(udp.sendto, b"\\0" * 12, ("8.8.8.8", 53)))
    """)
    out = probe_output(result)
    assert out == {"dns": "gaierror", "resolv_conf": False, "udp_53": "ENETUNREACH"}


def test_external_ip_is_unreachable(probe: ProbeRunner) -> None:
    result = probe.run("""
        import socket
        v4 = socket.socket()
        v4.settimeout(2)
        v6 = socket.socket(socket.AF_INET6)
        v6.settimeout(2)
        report(v4=attempt(v4.connect, ("1.1.1.1", 443)), v6=attempt(v6.connect, ("2606:4700:4700::1111", 443)),
               routes=open("/proc/net/route").read().splitlines()[1:])
    """)
    out = probe_output(result)
    assert out["v4"] == "ENETUNREACH", out
    assert out["v6"] in ("ENETUNREACH", "EADDRNOTAVAIL", "EAFNOSUPPORT"), out
    assert out["routes"] == []


def test_raw_and_packet_sockets_are_denied(probe: ProbeRunner) -> None:
    # Without CAP_NET_RAW: no crafted packets, no sniffing, even on the sandbox's own loopback.
    result = probe.run("""
        import socket
        report(raw_icmp=attempt(socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
               raw_tcp=attempt(socket.socket, socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
               packet=attempt(socket.socket, socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
               packet_dgram=attempt(socket.socket, socket.AF_PACKET, socket.SOCK_DGRAM, 0x0300))
    """)
    out = probe_output(result)
    assert out == {"raw_icmp": "EPERM", "raw_tcp": "EPERM", "packet": "EPERM", "packet_dgram": "EPERM"}


def test_network_configuration_cannot_be_changed(probe: ProbeRunner) -> None:
    # Bringing up an interface or adding an address needs CAP_NET_ADMIN, which the sandbox lacks.
    result = probe.run("""
        import fcntl, socket, struct
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        request = struct.pack("16sH14s", b"lo", 0x1 | 0x40, b"")  # IFF_UP | IFF_RUNNING
        report(set_flags=attempt(fcntl.ioctl, sock, 0x8914, request))  # SIOCSIFFLAGS
    """)
    assert probe_output(result) == {"set_flags": "EPERM"}
