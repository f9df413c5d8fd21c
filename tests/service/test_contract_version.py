"""The contract's version between client and service (rlvr_selector_client/contract.py): every answer
names it, a request naming another is refused with what to upgrade, and the client refuses a service of
another version the same way, at its first call."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from rlvr_selector_client import contract
from rlvr_selector_client.client import ContractMismatch, SelectorClient


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "/healthz"), ("GET", "/datasets/nope"), ("POST", "/select")]
)
def test_every_answer_names_the_contract_version(http: httpx.Client, method: str, path: str) -> None:
    response = http.request(method, path, json={} if method == "POST" else None)
    assert response.headers[contract.CONTRACT_HEADER] == str(contract.CONTRACT)


def test_a_request_without_the_header_is_served(http: httpx.Client) -> None:
    assert http.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("sent", "upgrade"),
    [
        (str(contract.CONTRACT + 1), "upgrade the service (pip install -U rlvr-selector"),
        (
            str(contract.CONTRACT - 1),
            "upgrade the client in the trainer's environment (pip install -U rlvr-selector-client)",
        ),
        ("two", "unreadable Selector-Contract header"),
    ],
)
def test_a_client_of_another_version_is_told_what_to_upgrade(
    http: httpx.Client, sent: str, upgrade: str
) -> None:
    response = http.get("/datasets", headers={contract.CONTRACT_HEADER: sent})
    assert response.status_code == 400
    assert upgrade in response.json()["detail"]
    assert response.headers[contract.CONTRACT_HEADER] == str(contract.CONTRACT)


def test_the_client_sends_its_version_and_speaks_to_the_service(service: Any) -> None:
    with SelectorClient(service.url) as client:
        assert client._headers[contract.CONTRACT_HEADER] == str(contract.CONTRACT)
        client.check_server()


@pytest.mark.parametrize(
    ("answered", "upgrade"),
    [
        (str(contract.CONTRACT + 1), "upgrade the client in the trainer's environment"),
        (str(contract.CONTRACT - 1), "upgrade the service"),
    ],
)
def test_the_client_refuses_a_service_of_another_version(answered: str, upgrade: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "ok"}, headers={contract.CONTRACT_HEADER: answered})

    client = SelectorClient("http://selector.test", transport=httpx.MockTransport(handler))
    with client, pytest.raises(ContractMismatch, match="upgrade") as caught:
        client.check_server()
    assert upgrade in str(caught.value)


def test_a_service_from_before_versions_were_sent_speaks_the_first() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "ok"})

    with SelectorClient("http://selector.test", transport=httpx.MockTransport(handler)) as client:
        if contract.CONTRACT == 1:
            assert client.healthz() == {"status": "ok"}
        else:
            with pytest.raises(ContractMismatch, match="upgrade the service"):
                client.healthz()
