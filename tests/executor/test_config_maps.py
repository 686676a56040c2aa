"""The executor's sweep of package ConfigMaps (``core.sweep_config_maps``): one is made per
configuration a package ever had; those no NodeWright wants any more, and no pod mounts, go
after a grace of one sweep."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import msgspec

from services.executor import core
from shared import api, progress
from shared.podspec import config_map_name
from tests.helpers.facts import T0, nodewright

CR = "tuning"
GRACE = 60.0


def _cr(config: dict[str, str] | None, **extra: Any) -> api.NodeWright:
    pkg: dict[str, Any] = {"version": "1.0.0", "image": "r/k"}
    if config is not None:
        pkg["configMap"] = config
    return nodewright(CR, packages={"k": pkg, **extra})


def _name(cr: api.NodeWright, package: str = "k") -> str:
    return config_map_name(CR, package, progress.desired(cr)[package].config_digest)


def _cms(*names: str, package: str = "k") -> list[core.PackageConfigMap]:
    return [core.PackageConfigMap(name=n, cr=CR, package=package) for n in names]


def _sweep(
    cms: list[core.PackageConfigMap],
    cr: api.NodeWright | None,
    *,
    seen: dict[str, Any] | None = None,
    mounted: set[str] | None = None,
    after_s: float = 0.0,
) -> core.ConfigMapSweep:
    return core.sweep_config_maps(
        cms,
        crs={CR: cr} if cr is not None else {},
        mounted=mounted or set(),
        seen=seen or {},
        now=T0 + timedelta(seconds=after_s),
        grace_s=GRACE,
    )


def test_an_old_configuration_goes_after_a_grace_and_the_current_one_stays() -> None:
    old, new = _cr({"a": "1"}), _cr({"a": "2"})
    cms = _cms(_name(old), _name(new))
    first = _sweep(cms, new)
    assert first.delete == (), "seen unwanted once: a pod may be about to mount it"
    assert dict(first.unwanted) == {_name(old): T0}
    early = _sweep(cms, new, seen=dict(first.unwanted), after_s=GRACE - 1)
    assert early.delete == ()
    assert dict(early.unwanted) == {_name(old): T0}, "still counted from the first sight"
    late = _sweep(cms, new, seen=dict(early.unwanted), after_s=GRACE)
    assert late.delete == (_name(old),)
    assert dict(late.unwanted) == {}


def test_a_configuration_a_pod_still_mounts_stays_and_its_grace_starts_over() -> None:
    old, new = _cr({"a": "1"}), _cr({"a": "2"})
    cms = _cms(_name(old), _name(new))
    seen = {_name(old): T0}
    mounted = _sweep(cms, new, seen=seen, mounted={_name(old)}, after_s=GRACE * 5)
    assert (mounted.delete, dict(mounted.unwanted)) == ((), {})
    freed = _sweep(cms, new, seen=dict(mounted.unwanted), after_s=GRACE * 6)
    assert freed.delete == ()
    assert dict(freed.unwanted) == {_name(old): T0 + timedelta(seconds=GRACE * 6)}


def test_a_package_gone_from_the_spec_or_without_configuration_any_more_loses_its() -> None:
    before = _cr({"a": "1"}, other={"version": "1.0.0", "image": "r/o", "configMap": {"b": "1"}})
    without_other = _cr({"a": "1"})
    without_config = _cr(None)
    cms = [*_cms(_name(before)), *_cms(_name(before, "other"), package="other")]
    seen = {n.name: T0 for n in cms}
    assert _sweep(cms, without_other, seen=seen, after_s=GRACE).delete == (_name(before, "other"),)
    assert _sweep(cms, without_config, seen=seen, after_s=GRACE).delete == tuple(
        sorted(n.name for n in cms)
    )


def test_a_nodewright_gone_or_being_deleted_keeps_them_for_its_owner_reference() -> None:
    old, new = _cr({"a": "1"}), _cr({"a": "2"})
    cms = _cms(_name(old))
    seen = {_name(old): T0}
    assert _sweep(cms, None, seen=seen, after_s=GRACE) == core.ConfigMapSweep()
    meta = msgspec.structs.replace(new.metadata, deletion_timestamp=T0)
    deleting = msgspec.structs.replace(new, metadata=meta)
    assert progress.deleting(deleting)
    assert _sweep(cms, deleting, seen=seen, after_s=GRACE) == core.ConfigMapSweep()


def test_another_nodewrights_configuration_is_not_this_ones_to_judge() -> None:
    """Two NodeWrights may hold a package of one name: each wants its own ConfigMap."""
    mine = _cr({"a": "1"})
    theirs = nodewright(
        "other", packages={"k": {"version": "1.0.0", "image": "r/k", "configMap": {"a": "9"}}}
    )
    their_name = config_map_name("other", "k", progress.desired(theirs)["k"].config_digest)
    cms = [*_cms(_name(mine)), core.PackageConfigMap(name=their_name, cr="other", package="k")]
    swept = core.sweep_config_maps(
        cms,
        crs={CR: mine, "other": theirs},
        mounted=set(),
        seen={n.name: T0 for n in cms},
        now=T0 + timedelta(seconds=GRACE),
        grace_s=GRACE,
    )
    assert swept == core.ConfigMapSweep()
