"""Collection and scope names: from a manifest, from the stream's system events, or the default.

Rows carry scope and collection names, not ids; the converter asks one of these for them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from replicator.dcp.protocol.events import SystemEvent, SystemEventType
from replicator.errors import ProtocolError

DEFAULT_SCOPE = "_default"
DEFAULT_COLLECTION = "_default"


class CollectionNames(Protocol):
    """Maps a collection id to its (scope, collection) names; raises LookupError if unknown."""

    def __call__(self, collection_id: int) -> tuple[str, str]: ...


@runtime_checkable
class CollectionLearner(Protocol):
    """A collection-name source that keeps itself current from the stream's system events."""

    def learn(self, event: SystemEvent) -> None: ...


def default_collection_names(collection_id: int) -> tuple[str, str]:
    """Names for a bucket without collections: only the default collection (id 0) exists."""
    if collection_id == 0:
        return DEFAULT_SCOPE, DEFAULT_COLLECTION
    raise LookupError(f"collection id {collection_id:#x} is not the default collection")


class CollectionRegistry:
    """Collection and scope names, learned from a manifest and from system events.

    >>> registry = CollectionRegistry.from_manifest(
    ...     {"uid": "2", "scopes": [{"name": "inventory", "uid": "8",
    ...      "collections": [{"name": "airline", "uid": "a"}]}]})
    >>> registry(0xA)
    ('inventory', 'airline')

    Names of dropped collections are kept: their rows may still be on their way.
    """

    def __init__(self) -> None:
        self._scopes: dict[int, str] = {0: DEFAULT_SCOPE}
        self._collections: dict[int, tuple[int, str]] = {0: (0, DEFAULT_COLLECTION)}
        self._manifest_uid = 0

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, object] | str | bytes) -> CollectionRegistry:
        """A registry holding the names of a GET_COLLECTIONS_MANIFEST answer."""
        registry = cls()
        registry.load_manifest(manifest)
        return registry

    @property
    def manifest_uid(self) -> int:
        """The highest manifest uid learned so far (0 before any)."""
        return self._manifest_uid

    def load_manifest(self, manifest: Mapping[str, object] | str | bytes) -> None:
        """Learn every scope and collection of a collections manifest (JSON text or parsed).

        The whole manifest is checked before anything is learned.
        """
        parsed: object = manifest
        if isinstance(manifest, str | bytes):
            try:
                parsed = json.loads(manifest)
            except ValueError as exc:
                raise ProtocolError(f"collections manifest is not JSON: {exc}") from exc
        if not isinstance(parsed, Mapping):
            raise ProtocolError("collections manifest is not a JSON object")
        manifest_uid = _hex_uid(parsed.get("uid"), "manifest uid")
        scopes: dict[int, str] = {}
        collections: dict[int, tuple[int, str]] = {}
        raw_scopes = parsed.get("scopes")
        if not isinstance(raw_scopes, list):
            raise ProtocolError("collections manifest: 'scopes' is not a list")
        for raw_scope in raw_scopes:
            if not isinstance(raw_scope, Mapping):
                raise ProtocolError("collections manifest: a scope is not an object")
            scope_name = _name(raw_scope.get("name"), "scope name")
            scope_id = _hex_uid(raw_scope.get("uid"), f"uid of scope {scope_name!r}")
            scopes[scope_id] = scope_name
            raw_collections = raw_scope.get("collections", [])
            if not isinstance(raw_collections, list):
                raise ProtocolError(
                    f"collections manifest: collections of scope {scope_name!r} is not a list"
                )
            for raw_collection in raw_collections:
                if not isinstance(raw_collection, Mapping):
                    raise ProtocolError(
                        f"collections manifest: a collection of scope {scope_name!r} is not "
                        "an object"
                    )
                name = _name(raw_collection.get("name"), f"collection name in {scope_name!r}")
                collection_id = _hex_uid(
                    raw_collection.get("uid"), f"uid of collection {scope_name}.{name}"
                )
                collections[collection_id] = (scope_id, name)
        self._scopes.update(scopes)
        self._collections.update(collections)
        self._manifest_uid = max(self._manifest_uid, manifest_uid)

    def learn(self, event: SystemEvent) -> None:
        """Learn a created scope or collection from a system event; other events change nothing."""
        if event.event is SystemEventType.SCOPE_CREATED and event.name:
            self._scopes[event.scope_id] = event.name
        elif (
            event.event is SystemEventType.COLLECTION_CREATED
            and event.name
            and event.collection_id is not None
        ):
            self._collections[event.collection_id] = (event.scope_id, event.name)
        self._manifest_uid = max(self._manifest_uid, event.manifest_uid)

    def __call__(self, collection_id: int) -> tuple[str, str]:
        """(scope, collection) names of `collection_id`; LookupError when never learned."""
        try:
            scope_id, name = self._collections[collection_id]
        except KeyError:
            raise LookupError(
                f"collection id {collection_id:#x} is unknown: load the bucket's collections "
                "manifest before streaming"
            ) from None
        try:
            return self._scopes[scope_id], name
        except KeyError:
            raise LookupError(
                f"scope id {scope_id:#x} of collection {name!r} is unknown: load the bucket's "
                "collections manifest before streaming"
            ) from None


def collections_with_history(manifest: Mapping[str, object]) -> list[str]:
    """`scope.collection` of every collection a manifest marks `"history": true` (7.2+).

    >>> collections_with_history({"uid": "2", "scopes": [{"name": "app", "uid": "8",
    ...     "collections": [{"name": "orders", "uid": "9", "history": True},
    ...                     {"name": "carts", "uid": "a"}]}]})
    ['app.orders']
    """
    found = []
    scopes = manifest.get("scopes")
    for scope in scopes if isinstance(scopes, list) else []:
        if not isinstance(scope, Mapping):
            continue
        collections = scope.get("collections")
        for collection in collections if isinstance(collections, list) else []:
            if isinstance(collection, Mapping) and collection.get("history") is True:
                found.append(f"{scope.get('name')}.{collection.get('name')}")
    return found


def _hex_uid(raw: object, what: str) -> int:
    if not isinstance(raw, str):
        raise ProtocolError(f"collections manifest: {what} is missing or not a hex string")
    try:
        return int(raw, 16)
    except ValueError:
        raise ProtocolError(f"collections manifest: {what} {raw!r} is not hex") from None


def _name(raw: object, what: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise ProtocolError(f"collections manifest: {what} is missing or not a string")
    return raw
