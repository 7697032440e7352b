"""Scopes and collections of the simulated bucket, and the system events their changes emit.

Mirrors kv_engine's rules (spec/kv_engine/Collections.md, dcp commands/system_event.md): ids 0-7
are reserved and 0 is `_default`; every change bumps the manifest uid; a change that needs
several system events stamps only the last one with the new uid. Every vbucket writes each
event into its own history, which the bucket does with the `ManifestChange`s returned here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from replicator.dcp.protocol.events import SystemEventType

DEFAULT_SCOPE = "_default"
DEFAULT_COLLECTION = "_default"
DEFAULT_SCOPE_ID = 0
DEFAULT_COLLECTION_ID = 0
DEFAULT_COLLECTION_PATH = "_default._default"
FIRST_USER_ID = 8
"""Ids 0 to 7 are reserved for the server."""

_USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_%-]{0,250}")


class UnknownScopeError(LookupError):
    """No live scope of that name (memcached status 0x8c)."""

    def __init__(self, scope: str, manifest_uid: int) -> None:
        super().__init__(f"unknown scope {scope!r} (manifest uid {manifest_uid:x})")
        self.scope = scope
        self.manifest_uid = manifest_uid


class UnknownCollectionError(LookupError):
    """No live collection of that path or id (memcached status 0x88)."""

    def __init__(self, collection: str, manifest_uid: int) -> None:
        super().__init__(f"unknown collection {collection} (manifest uid {manifest_uid:x})")
        self.collection = collection
        self.manifest_uid = manifest_uid


@dataclass(frozen=True, slots=True)
class ScopeSpec:
    """A scope: its name and id."""

    name: str
    scope_id: int


@dataclass(frozen=True, slots=True)
class CollectionSpec:
    """A collection: its name, id, the scope it belongs to and its `history` setting.

    `history` (Couchbase 7.2+, magma buckets) says the bucket retains every revision of the
    collection's documents within its history window, for DCP change streams.
    """

    name: str
    collection_id: int
    scope_name: str
    scope_id: int
    history: bool = False

    @property
    def path(self) -> str:
        """`scope.collection`, the way SDKs and the manifest name it."""
        return f"{self.scope_name}.{self.name}"


@dataclass(frozen=True, slots=True)
class ManifestChange:
    """One system event that every vbucket writes for a manifest change.

    `sequence` numbers the events of the manifest's whole life from 0, so a vbucket that lost
    some of them (failover) can replay exactly the ones it lacks. `name` is empty for drops.
    """

    sequence: int
    event: SystemEventType
    manifest_uid: int
    scope_id: int
    collection_id: int | None
    name: str


def split_collection_path(path: str) -> tuple[str, str]:
    """`"scope.collection"` as (scope, collection); a bare name means the `_default` scope."""
    scope, dot, collection = path.partition(".")
    if not dot:
        return DEFAULT_SCOPE, path
    if not scope or not collection or "." in collection:
        raise ValueError(f"collection path must be 'scope.collection', got {path!r}")
    return scope, collection


class CollectionsManifest:
    """The bucket's collections manifest: live scopes and collections plus every change made.

    Not thread-safe: the owning bucket serialises changes under its lock.

    >>> manifest = CollectionsManifest()
    >>> changes = manifest.create_scope("app") + manifest.create_collection("app", "users")
    >>> manifest.collection("app.users").collection_id, manifest.uid
    (8, 2)
    """

    def __init__(self, *, default_collection_history: bool = False) -> None:
        self._uid = 0
        self._next_scope_id = FIRST_USER_ID
        self._next_collection_id = FIRST_USER_ID
        self._scopes: dict[str, ScopeSpec] = {DEFAULT_SCOPE: ScopeSpec(DEFAULT_SCOPE, 0)}
        default = CollectionSpec(
            DEFAULT_COLLECTION,
            DEFAULT_COLLECTION_ID,
            DEFAULT_SCOPE,
            DEFAULT_SCOPE_ID,
            history=default_collection_history,
        )
        self._collections: dict[str, CollectionSpec] = {default.path: default}
        self._ever: dict[int, CollectionSpec] = {DEFAULT_COLLECTION_ID: default}
        self._changes: list[ManifestChange] = []

    @property
    def uid(self) -> int:
        return self._uid

    @property
    def changes(self) -> tuple[ManifestChange, ...]:
        """Every system event the manifest has asked vbuckets to write, oldest first."""
        return tuple(self._changes)

    def scopes(self) -> tuple[ScopeSpec, ...]:
        """Live scopes in creation order (`_default` first)."""
        return tuple(self._scopes.values())

    def collections(self) -> tuple[CollectionSpec, ...]:
        """Live collections in creation order."""
        return tuple(self._collections.values())

    def collection(self, path: str) -> CollectionSpec:
        """The live collection at `path` ("scope.collection"; a bare name is in `_default`)."""
        scope, name = split_collection_path(path)
        spec = self._collections.get(f"{scope}.{name}")
        if spec is None:
            raise UnknownCollectionError(f"{scope}.{name}", self._uid)
        return spec

    def collection_by_id(self, collection_id: int) -> CollectionSpec:
        """The collection with this id, live or dropped (ids are never reused)."""
        spec = self._ever.get(collection_id)
        if spec is None:
            raise UnknownCollectionError(f"id 0x{collection_id:x}", self._uid)
        return spec

    def is_live(self, collection_id: int) -> bool:
        spec = self._ever.get(collection_id)
        return spec is not None and self._collections.get(spec.path) == spec

    def create_scope(self, name: str) -> tuple[ManifestChange, ...]:
        """Add a scope; returns its SCOPE_CREATED event."""
        _check_user_name(name, "scope")
        if name in self._scopes:
            raise ValueError(f"scope {name!r} already exists")
        scope = ScopeSpec(name, self._next_scope_id)
        self._next_scope_id += 1
        self._scopes[name] = scope
        self._uid += 1
        return (self._record(SystemEventType.SCOPE_CREATED, scope.scope_id, None, name),)

    def create_collection(
        self, scope: str, name: str, *, history: bool = False
    ) -> tuple[ManifestChange, ...]:
        """Add a collection to a live scope; returns its COLLECTION_CREATED event.

        `history` is the collection's history setting (every revision retained).
        """
        _check_user_name(name, "collection")
        owner = self._live_scope(scope)
        if f"{scope}.{name}" in self._collections:
            raise ValueError(f"collection {scope}.{name} already exists")
        spec = CollectionSpec(
            name, self._next_collection_id, scope, owner.scope_id, history=history
        )
        self._next_collection_id += 1
        self._collections[spec.path] = spec
        self._ever[spec.collection_id] = spec
        self._uid += 1
        return (
            self._record(
                SystemEventType.COLLECTION_CREATED, owner.scope_id, spec.collection_id, name
            ),
        )

    def drop_collection(self, scope: str, name: str) -> tuple[ManifestChange, ...]:
        """Drop a live collection (`_default` included); returns its COLLECTION_DROPPED event."""
        self._live_scope(scope)
        spec = self.collection(f"{scope}.{name}")
        del self._collections[spec.path]
        self._uid += 1
        return (
            self._record(SystemEventType.COLLECTION_DROPPED, spec.scope_id, spec.collection_id, ""),
        )

    def drop_scope(self, name: str) -> tuple[ManifestChange, ...]:
        """Drop a scope and its collections: one COLLECTION_DROPPED each, then SCOPE_DROPPED.

        Only the final event carries the new manifest uid, as in kv_engine.
        """
        if name == DEFAULT_SCOPE:
            raise ValueError("the _default scope cannot be dropped")
        scope = self._live_scope(name)
        members = [c for c in self._collections.values() if c.scope_id == scope.scope_id]
        events: list[ManifestChange] = []
        for spec in members:
            del self._collections[spec.path]
            events.append(
                self._record(
                    SystemEventType.COLLECTION_DROPPED, scope.scope_id, spec.collection_id, ""
                )
            )
        del self._scopes[name]
        self._uid += 1
        events.append(self._record(SystemEventType.SCOPE_DROPPED, scope.scope_id, None, ""))
        return tuple(events)

    def manifest_json(self) -> str:
        """The GET_COLLECTIONS_MANIFEST (0xba) answer: uids as hex strings without 0x.

        A collection with history says `"history": true`; kv_engine leaves the key out when
        it is false.
        """
        return json.dumps(self._document(rest=False), separators=(",", ":"))

    def rest_json(self) -> str:
        """The management API's `GET /pools/default/buckets/BUCKET/scopes` answer.

        As ns_server 7.6 lists them: every collection with its `maxTTL` (0: the bucket's) and
        `history`, true or false.
        """
        return json.dumps(self._document(rest=True), separators=(",", ":"))

    def _document(self, *, rest: bool) -> dict[str, object]:
        scopes = [
            {
                "name": scope.name,
                "uid": f"{scope.scope_id:x}",
                "collections": [
                    _collection_entry(c, rest=rest)
                    for c in self._collections.values()
                    if c.scope_id == scope.scope_id
                ],
            }
            for scope in self._scopes.values()
        ]
        return {"uid": f"{self._uid:x}", "scopes": scopes}

    def _live_scope(self, name: str) -> ScopeSpec:
        scope = self._scopes.get(name)
        if scope is None:
            raise UnknownScopeError(name, self._uid)
        return scope

    def _record(
        self,
        event: SystemEventType,
        scope_id: int,
        collection_id: int | None,
        name: str,
    ) -> ManifestChange:
        # Callers bump the uid only for the last event of a change, so earlier events of a
        # multi-event change carry the previous uid, as kv_engine stamps them.
        change = ManifestChange(len(self._changes), event, self._uid, scope_id, collection_id, name)
        self._changes.append(change)
        return change


def _collection_entry(spec: CollectionSpec, *, rest: bool) -> dict[str, object]:
    entry: dict[str, object] = {"name": spec.name, "uid": f"{spec.collection_id:x}"}
    if rest:
        entry["maxTTL"] = 0
        entry["history"] = spec.history
    elif spec.history:
        entry["history"] = True
    return entry


def _check_user_name(name: str, kind: str) -> None:
    if not _USER_NAME.fullmatch(name):
        raise ValueError(
            f"invalid {kind} name {name!r}: 1-251 characters of A-Z a-z 0-9 _ - %, "
            "not starting with _ or %"
        )
