"""`speculoos serve --host` decides where the proxy listens, and so which Host names its browser guard accepts."""

from __future__ import annotations

from pathlib import Path

from tests import support as http
from tests.e2e.servers import start_server
from tests.support import free_port

# No draft and an openai upstream: the proxy starts without a model and answers /v1/models by itself.
ROUTES = """
server: {host: 0.0.0.0}
routes:
  - {name: plain, match: {model: plain}, upstream: {url: "http://127.0.0.1:9", protocol: openai}}
"""


def test_the_host_rule_follows_the_address_served_not_the_files(tmp_path: Path) -> None:
    routes = tmp_path / "routes.yaml"
    routes.write_text(ROUTES)
    port = free_port()
    proxy = start_server(["serve", "--routes", str(routes), "--host", "127.0.0.1", "--port", str(port)], port,
                         tmp_path / "proxy.log", "/v1/models")
    try:
        rebound = http.request("GET", proxy.url + "/v1/models", headers={"Host": f"evil.example:{port}"}, timeout=30)
        assert rebound.status == 403  # bound to loopback: a rebound name is refused, whatever the file says
        assert rebound.json()["error"]["type"] == "permission_error"
        assert http.get(proxy.url + "/v1/models", timeout=30).status == 200
    finally:
        proxy.stop()
