#!/usr/bin/python3
"""Check fleet's provisioned Grafana dashboard, statically and against a live Prometheus.

Static checks (always):
  - the datasource provisioning file names a prometheus datasource with a uid;
  - the dashboard provider file names a file provider with a path (and, with
    --dashboards-path, that exact path);
  - the dashboard JSON parses, has uid, title and schemaVersion >= 30;
  - panel ids are unique, panels nested in rows included;
  - every panel, target, annotation and query variable uses the provisioned
    datasource uid;
  - every target has a non-empty expr and a refId unique within its panel;
  - every $var, ${var} or [[var]] in an expression is a Grafana built-in or a
    variable defined under templating;
  - every panel has a gridPos inside the 24-column grid, and no two overlap.

Live checks (with --prometheus URL): every expression of the panels, the
annotations and the query variables is run against URL/api/v1 and must answer
status success with at least one series. Panel expressions and variable
queries run as instant queries; annotations run as a range query over the
dashboard's time range, as Grafana runs them (an annotation such as
"increase(...) > 0" has data only around the events it marks). Built-ins are
replaced by --rate-interval, --interval and --range; a template variable by a
--var value, else by the value the dashboard opens with (the allValue, or a
regex of its values, when that is All).

Exit status: 0 when every check passed, 1 when any failed, 2 on bad usage.
Standard library only; runs with /usr/bin/python3.
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "docker" / "grafana"
GRID_COLUMNS = 24

# Grafana's global variables that may appear in a Prometheus query.
BUILTINS = {
    "__interval", "__interval_ms", "__rate_interval", "__rate_interval_ms",
    "__range", "__range_s", "__range_ms", "__from", "__to",
    "__dashboard", "__org", "__user", "__timezone",
}

# $name, ${name} or ${name:format}, [[name]] or [[name:format]].
VARIABLE_RE = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}|\$(?P<plain>\w+)|\[\[(?P<old>\w+)(?::[^\]]*)?\]\]")

DURATION_RE = re.compile(r"^(\d+)(ms|s|m|h|d|w|y)$")
DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
                    "y": 31536000}


class Failures:
    """Collects failures; each is one line a person can act on."""

    def __init__(self):
        self.items = []

    def add(self, where, message):
        self.items.append(f"{where}: {message}")

    def __bool__(self):
        return bool(self.items)


# ---------------------------------------------------------------- tiny YAML

class YamlError(ValueError):
    pass


def _scalar(text):
    text = text.strip()
    if text[:1] in ("'", '"'):
        quote = text[0]
        end = text.find(quote, 1)
        if end < 0:
            raise YamlError(f"unterminated quoted string: {text}")
        return text[1:end]
    text = re.split(r"\s+#", text, maxsplit=1)[0].strip()
    lowered = text.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("", "~", "null"):
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return text


def parse_yaml(text):
    """Parses the block-style YAML subset Grafana provisioning files use:
    nested mappings, lists of mappings or scalars, plain or quoted scalars,
    comments. Flow collections ([a, b], {a: b}) come back as strings."""
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise YamlError(f"line {number}: tab in indentation")
        stripped = raw.strip()
        if not stripped or stripped.startswith("#") or stripped in ("---", "..."):
            continue
        lines.append([len(raw) - len(raw.lstrip(" ")), stripped, number])
    if not lines:
        return None
    pos = 0

    def node(indent):
        nonlocal pos
        if lines[pos][1].startswith("- ") or lines[pos][1] == "-":
            return sequence(indent)
        return mapping(indent)

    def sequence(indent):
        nonlocal pos
        items = []
        while pos < len(lines) and lines[pos][0] == indent and (
                lines[pos][1].startswith("- ") or lines[pos][1] == "-"):
            rest = lines[pos][1][1:].lstrip()
            if not rest:
                pos += 1
                if pos < len(lines) and lines[pos][0] > indent:
                    items.append(node(lines[pos][0]))
                else:
                    items.append(None)
            elif re.match(r"^[^'\"\s][^:]*:(\s|$)", rest) or re.match(r"^['\"][^'\"]*['\"]:(\s|$)", rest):
                # "- key: value" opens a mapping indented past the dash.
                lines[pos][0] = indent + (len(lines[pos][1]) - len(rest))
                lines[pos][1] = rest
                items.append(mapping(lines[pos][0]))
            else:
                items.append(_scalar(rest))
                pos += 1
        return items

    def mapping(indent):
        nonlocal pos
        result = {}
        while pos < len(lines) and lines[pos][0] == indent and not lines[pos][1].startswith("- "):
            _, content, number = lines[pos]
            match = re.match(r"^(['\"]?)([^'\":]+)\1:(?:\s+(.*))?$", content)
            if not match:
                raise YamlError(f"line {number}: expected 'key: value', got {content!r}")
            key, value = match.group(2).strip(), (match.group(3) or "").strip()
            pos += 1
            if value and not value.startswith("#"):
                if value[:1] in ("|", ">"):
                    raise YamlError(f"line {number}: block scalars are not supported")
                result[key] = _scalar(value)
            elif pos < len(lines) and (lines[pos][0] > indent or (
                    lines[pos][0] == indent and lines[pos][1].startswith("- "))):
                result[key] = node(lines[pos][0])
            else:
                result[key] = None
        if pos < len(lines) and lines[pos][0] > indent:
            raise YamlError(f"line {lines[pos][2]}: unexpected indentation")
        return result

    value = node(lines[0][0])
    if pos != len(lines):
        raise YamlError(f"line {lines[pos][2]}: unexpected content {lines[pos][1]!r}")
    return value


# ------------------------------------------------------- provisioning files

def load_yaml(path, failures):
    try:
        return parse_yaml(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        failures.add(path, f"cannot read: {e.strerror}")
    except YamlError as e:
        failures.add(path, f"cannot parse: {e}")
    return None


def check_datasources(path, failures):
    """Returns the uid of the provisioned Prometheus datasource, or None."""
    doc = load_yaml(path, failures)
    if doc is None:
        return None
    sources = doc.get("datasources") if isinstance(doc, dict) else None
    if not isinstance(sources, list) or not sources:
        failures.add(path, "no 'datasources:' list")
        return None
    proms = [s for s in sources if isinstance(s, dict) and s.get("type") == "prometheus"]
    if len(proms) != 1:
        failures.add(path, f"expected one datasource of type prometheus, found {len(proms)}")
        return None
    source = proms[0]
    uid = source.get("uid")
    if not isinstance(uid, str) or not uid:
        failures.add(path, "the prometheus datasource has no uid (dashboards refer to it by uid)")
        return None
    if not source.get("url"):
        failures.add(path, f"datasource {uid} has no url")
    return uid


def check_provider(path, expected_path, failures):
    """Returns the path the file provider loads dashboards from, or None."""
    doc = load_yaml(path, failures)
    if doc is None:
        return None
    providers = doc.get("providers") if isinstance(doc, dict) else None
    if not isinstance(providers, list) or not providers:
        failures.add(path, "no 'providers:' list")
        return None
    paths = []
    for i, provider in enumerate(providers):
        where = f"{path}: provider {i}"
        if not isinstance(provider, dict):
            failures.add(where, "is not a mapping")
            continue
        if provider.get("type", "file") != "file":
            continue
        options = provider.get("options")
        dir_path = options.get("path") if isinstance(options, dict) else None
        if not isinstance(dir_path, str) or not dir_path.startswith("/"):
            failures.add(where, "names no absolute options.path to load dashboards from")
            continue
        paths.append(dir_path)
    if not paths:
        failures.add(path, "no file provider with a path")
        return None
    if expected_path and expected_path.rstrip("/") not in [p.rstrip("/") for p in paths]:
        failures.add(path, f"loads dashboards from {', '.join(paths)}, "
                           f"not from {expected_path} (where they are mounted)")
    return paths[0]


# ------------------------------------------------------------ the dashboard

def all_panels(dashboard):
    """Yields (panel, where, parent_row) for every panel, nested ones too."""
    for panel in dashboard.get("panels") or []:
        yield panel, describe(panel), None
        for inner in panel.get("panels") or []:
            yield inner, f"{describe(inner)} (in {describe(panel)})", panel


def describe(panel):
    return f"panel {panel.get('id', '?')} '{panel.get('title', '')}'"


def variables_in(text):
    for m in VARIABLE_RE.finditer(text):
        yield m.group("braced") or m.group("plain") or m.group("old")


def check_datasource_ref(ref, uid, where, failures):
    if not isinstance(ref, dict):
        failures.add(where, f"datasource is {json.dumps(ref)}, "
                            f"not {{\"type\": \"prometheus\", \"uid\": \"{uid or 'UID'}\"}}")
        return
    if uid is not None and ref.get("uid") != uid:
        failures.add(where, f"datasource uid is {ref.get('uid')!r}, not {uid!r}")
    elif not ref.get("uid"):
        failures.add(where, "datasource has no uid")
    if ref.get("type") != "prometheus":
        failures.add(where, f"datasource type is {ref.get('type')!r}, not 'prometheus'")


def check_brackets(expr, where, failures):
    """PromQL itself is checked live; this catches the unbalanced bracket or
    quote that would otherwise only show up there."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack, quote, escaped = [], None, False
    for ch in expr:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in closing:
            if not stack or stack.pop() != closing[ch]:
                failures.add(where, f"has an unmatched {ch!r}: {expr}")
                return
    if quote:
        failures.add(where, f"has an unterminated {quote} string: {expr}")
    elif stack:
        failures.add(where, f"has an unclosed {stack[-1]!r}: {expr}")


def check_variables_used(expr, defined, where, failures):
    for name in variables_in(expr):
        if name not in BUILTINS and name not in defined:
            failures.add(where, f"uses ${name}, which is neither a Grafana built-in "
                                f"nor a templating variable")


def variable_query(variable):
    query = variable.get("query")
    if isinstance(query, dict):
        query = query.get("query")
    return query if isinstance(query, str) else ""


def check_grid(panels, failures):
    boxes = []
    for panel, where in panels:
        grid = panel.get("gridPos")
        keys = ("x", "y", "w", "h")
        if not isinstance(grid, dict) or not all(isinstance(grid.get(k), int) for k in keys):
            failures.add(where, "has no gridPos with integer x, y, w, h")
            continue
        x, y, w, h = (grid[k] for k in keys)
        if w < 1 or h < 1 or x < 0 or y < 0 or x + w > GRID_COLUMNS:
            failures.add(where, f"gridPos {grid} is outside the {GRID_COLUMNS}-column grid")
            continue
        for other_where, (ox, oy, ow, oh) in boxes:
            if x < ox + ow and ox < x + w and y < oy + oh and oy < y + h:
                failures.add(where, f"overlaps {other_where}")
        boxes.append((where, (x, y, w, h)))


def check_dashboard(dashboard, uid, failures):
    where = "dashboard"
    for key in ("uid", "title"):
        if not isinstance(dashboard.get(key), str) or not dashboard[key]:
            failures.add(where, f"has no {key}")
    schema = dashboard.get("schemaVersion")
    if not isinstance(schema, int) or schema < 30:
        failures.add(where, f"schemaVersion is {schema!r}, want 30 or more")

    defined = set()
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        name = variable.get("name")
        vwhere = f"variable ${name}"
        if not name:
            failures.add("templating", "a variable has no name")
            continue
        if name in defined:
            failures.add(vwhere, "is defined twice")
        defined.add(name)
        if variable.get("type") == "datasource":
            failures.add(vwhere, "is a datasource variable; panels must use the fixed uid")
        if variable.get("type") == "query":
            check_datasource_ref(variable.get("datasource"), uid, vwhere, failures)
            if not variable_query(variable).strip():
                failures.add(vwhere, "has an empty query")
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") == "query":
            check_variables_used(variable_query(variable), defined - {variable.get("name")},
                                 f"variable ${variable.get('name')}", failures)

    panels = list(all_panels(dashboard))
    if not any(p.get("type") != "row" for p, _, _ in panels):
        failures.add(where, "has no panels")
    seen_ids = {}
    for panel, pwhere, parent in panels:
        pid = panel.get("id")
        if not isinstance(pid, int):
            failures.add(pwhere, "has no integer id")
        elif pid in seen_ids:
            failures.add(pwhere, f"has the same id as {seen_ids[pid]}")
        else:
            seen_ids[pid] = pwhere
        check_datasource_ref(panel.get("datasource"), uid, pwhere, failures)
        if panel.get("type") == "row":
            if parent is not None:
                failures.add(pwhere, "is a row inside a row")
            if panel.get("panels") and not panel.get("collapsed"):
                failures.add(pwhere, "is expanded but holds panels (Grafana wants them at the "
                                     "top level after it)")
            continue
        targets = panel.get("targets") or []
        if not targets:
            failures.add(pwhere, "has no targets")
        refs = set()
        for i, target in enumerate(targets):
            twhere = f"{pwhere} target {target.get('refId') or '#' + str(i)}"
            check_datasource_ref(target.get("datasource"), uid, twhere, failures)
            ref = target.get("refId")
            if not isinstance(ref, str) or not ref:
                failures.add(twhere, "has no refId")
            elif ref in refs:
                failures.add(twhere, "has a refId used twice in the panel")
            refs.add(ref)
            expr = target.get("expr")
            if not isinstance(expr, str) or not expr.strip():
                failures.add(twhere, "has no expr")
                continue
            check_brackets(expr, twhere, failures)
            check_variables_used(expr, defined, twhere, failures)

    # Top-level panels share one grid; a collapsed row's panels form their own.
    check_grid([(p, w) for p, w, parent in panels if parent is None], failures)
    for row in [p for p, _, _ in panels if p.get("type") == "row"]:
        nested = [(p, w) for p, w, parent in panels if parent is row]
        if nested:
            check_grid(nested, failures)

    annotations = (dashboard.get("annotations") or {}).get("list") or []
    for i, annotation in enumerate(annotations):
        awhere = f"annotation '{annotation.get('name', i)}'"
        if annotation.get("builtIn") == 1:
            continue  # Grafana's own "Annotations & Alerts", not a Prometheus query
        check_datasource_ref(annotation.get("datasource"), uid, awhere, failures)
        expr = annotation.get("expr")
        if not isinstance(expr, str) or not expr.strip():
            failures.add(awhere, "has no expr")
            continue
        check_brackets(expr, awhere, failures)
        check_variables_used(expr, defined, awhere, failures)

    return len([p for p, _, _ in panels if p.get("type") != "row"])


# --------------------------------------------------------------- live checks

class Prometheus:
    def __init__(self, base_url, timeout):
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        # Loopback or not, never go through a proxy from the environment.
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path, params=None):
        """Returns (data, error): the 'data' of a successful answer, else None and why."""
        url = f"{self.base}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with self.opener.open(url, timeout=self.timeout) as response:
                body = response.read()
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                answer = json.loads(body)
                return None, f"HTTP {e.code}: {answer.get('errorType')}: {answer.get('error')}"
            except ValueError:
                return None, f"HTTP {e.code} {e.reason}"
        except (urllib.error.URLError, OSError) as e:
            return None, f"cannot reach {self.base}: {getattr(e, 'reason', e)}"
        try:
            answer = json.loads(body)
        except ValueError:
            return None, "the answer is not JSON"
        if answer.get("status") != "success":
            return None, f"status {answer.get('status')}: {answer.get('error')}"
        return answer.get("data"), None

    def instant(self, expr):
        return self.get("/api/v1/query", {"query": expr})

    def range(self, expr, seconds, step):
        end = time.time()
        return self.get("/api/v1/query_range",
                        {"query": expr, "start": f"{end - seconds:.3f}", "end": f"{end:.3f}",
                         "step": step})


def duration_seconds(text):
    m = DURATION_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 15s, 1m or 5m")
    return int(m.group(1)) * DURATION_SECONDS[m.group(2)]


def dashboard_range_seconds(dashboard):
    start = str((dashboard.get("time") or {}).get("from", "now-15m"))
    m = re.fullmatch(r"now-(\d+(?:ms|s|m|h|d|w|y))", start)
    return duration_seconds(m.group(1)) if m else 900


def variable_values(dashboard, overrides):
    """The value each template variable has when the dashboard opens."""
    values = {}
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        name = variable.get("name")
        if name in overrides:
            values[name] = overrides[name]
            continue
        current = (variable.get("current") or {}).get("value")
        chosen = current if isinstance(current, list) else [current]
        chosen = [str(v) for v in chosen if v is not None and v != ""]
        if not chosen or "$__all" in chosen:
            if variable.get("allValue"):
                values[name] = variable["allValue"]
            else:
                options = [str(o.get("value")) for o in variable.get("options") or []
                           if o.get("value") not in (None, "$__all")]
                values[name] = "(" + "|".join(map(re.escape, options)) + ")" if options else ".+"
        else:
            values[name] = chosen[0] if len(chosen) == 1 else "(" + "|".join(chosen) + ")"
    return values


def substitute(expr, values):
    def replace(m):
        name = m.group("braced") or m.group("plain") or m.group("old")
        return values.get(name, m.group(0))
    return VARIABLE_RE.sub(replace, expr)


def builtin_values(args, range_seconds):
    rate = duration_seconds(args.rate_interval)
    interval = duration_seconds(args.interval)
    rng = duration_seconds(args.range)
    now_ms = int(time.time() * 1000)
    return {
        "__rate_interval": args.rate_interval, "__rate_interval_ms": str(int(rate * 1000)),
        "__interval": args.interval, "__interval_ms": str(int(interval * 1000)),
        "__range": args.range, "__range_s": str(int(rng)), "__range_ms": str(int(rng * 1000)),
        "__from": str(now_ms - int(range_seconds * 1000)), "__to": str(now_ms),
    }


def collect_expressions(dashboard):
    """(kind, where, expr, extra) for every query the dashboard makes."""
    found = []
    for variable in (dashboard.get("templating") or {}).get("list") or []:
        if variable.get("type") == "query":
            found.append(("variable", f"variable ${variable.get('name')}",
                          variable_query(variable), None))
    for annotation in (dashboard.get("annotations") or {}).get("list") or []:
        if annotation.get("builtIn") != 1 and annotation.get("expr"):
            found.append(("annotation", f"annotation '{annotation.get('name')}'",
                          annotation["expr"], annotation.get("step") or "15s"))
    for panel, where, _ in all_panels(dashboard):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                found.append(("panel", f"{where} {target.get('refId')}", target["expr"], None))
    return found


def run_variable_query(prom, query):
    """Runs a Grafana Prometheus variable query; returns (count, error)."""
    query = query.strip()
    m = re.fullmatch(r"label_values\(\s*(.+?)\s*,\s*(\w+)\s*\)", query, re.S)
    if m:
        data, error = prom.get("/api/v1/series", {"match[]": m.group(1)})
        if error:
            return 0, error
        return len({s[m.group(2)] for s in data or [] if m.group(2) in s}), None
    m = re.fullmatch(r"label_values\(\s*(\w+)\s*\)", query)
    if m:
        data, error = prom.get(f"/api/v1/label/{m.group(1)}/values")
        return (len(data or []), error)
    m = re.fullmatch(r"query_result\((.+)\)", query, re.S)
    if m:
        data, error = prom.instant(m.group(1))
        return (len((data or {}).get("result") or []), error)
    m = re.fullmatch(r"metrics\((.+)\)", query, re.S)
    if m:
        data, error = prom.get("/api/v1/label/__name__/values")
        if error:
            return 0, error
        pattern = re.compile(m.group(1).strip())
        return len([n for n in data or [] if pattern.search(n)]), None
    # Anything else Grafana runs as a plain PromQL query.
    data, error = prom.instant(query)
    return (len((data or {}).get("result") or []), error)


def run_live(prom, expressions, values, range_seconds):
    """Returns one (ok, line) per expression."""
    results = []
    for kind, where, expr, step in expressions:
        query = substitute(expr, values)
        leftover = sorted(set(variables_in(query)))
        if leftover:
            results.append((False, f"FAIL  {where}: no value for ${', $'.join(leftover)}: {expr}"))
            continue
        if kind == "variable":
            count, error = run_variable_query(prom, query)
            noun = "values"
        elif kind == "annotation":
            data, error = prom.range(query, range_seconds, step)
            count, noun = len((data or {}).get("result") or []), "series over the time range"
        else:
            data, error = prom.instant(query)
            result = (data or {}).get("result") or []
            count, noun = len(result), "series"
            nans = sum(1 for s in result if isinstance(s, dict) and _is_nan(s.get("value")))
            if nans:
                noun += f" ({nans} NaN)"
        if error:
            results.append((False, f"FAIL  {where}: {error}: {query}"))
        elif count == 0:
            results.append((False, f"FAIL  {where}: 0 {noun}: {query}"))
        else:
            results.append((True, f"ok    {where}: {count} {noun}: {query}"))
    return results


def _is_nan(value):
    try:
        return math.isnan(float(value[1]))
    except (TypeError, ValueError, IndexError):
        return False


# ---------------------------------------------------------------------- main

def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Check fleet's Grafana dashboard and provisioning files; with "
                    "--prometheus, also run every query against a live Prometheus.",
        epilog="Exit status: 0 when every check passed, 1 when any failed, 2 on bad usage.")
    parser.add_argument("--dashboard", default=str(GRAFANA / "dashboards" / "fleet.json"),
                        help="dashboard JSON (default: %(default)s)")
    parser.add_argument("--datasources",
                        default=str(GRAFANA / "provisioning" / "datasources" / "prometheus.yml"),
                        help="datasource provisioning YAML (default: %(default)s)")
    parser.add_argument("--provider",
                        default=str(GRAFANA / "provisioning" / "dashboards" / "fleet.yml"),
                        help="dashboard provider YAML (default: %(default)s)")
    parser.add_argument("--dashboards-path", metavar="PATH",
                        help="the path the dashboards are mounted at in the Grafana container; "
                             "the provider must load from it")
    parser.add_argument("--prometheus", metavar="URL",
                        help="run every expression against this Prometheus "
                             "(e.g. http://127.0.0.1:9090)")
    parser.add_argument("--rate-interval", default="1m", type=_duration_arg,
                        help="value of $__rate_interval (default: %(default)s)")
    parser.add_argument("--interval", default="15s", type=_duration_arg,
                        help="value of $__interval (default: %(default)s)")
    parser.add_argument("--range", default="5m", type=_duration_arg,
                        help="value of $__range (default: %(default)s)")
    parser.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                        help="value for a template variable (default: the value the "
                             "dashboard opens with); repeatable")
    parser.add_argument("--wait", type=float, default=0, metavar="SECONDS",
                        help="retry the live checks until all pass or this time is up "
                             "(Prometheus needs a few scrapes before rate() has data)")
    parser.add_argument("--timeout", type=float, default=5, metavar="SECONDS",
                        help="per request to Prometheus (default: %(default)s)")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep or not name:
            parser.error(f"--var wants NAME=VALUE, got {item!r}")
        overrides[name] = value
    args.var_values = overrides
    if args.wait < 0 or args.timeout <= 0:
        parser.error("--wait must be >= 0 and --timeout > 0")
    return args


def _duration_arg(text):
    duration_seconds(text)
    return text


def main(argv):
    args = parse_args(argv)
    failures = Failures()

    uid = check_datasources(args.datasources, failures)
    provider_path = check_provider(args.provider, args.dashboards_path, failures)
    dashboard = None
    try:
        dashboard = json.loads(Path(args.dashboard).read_text(encoding="utf-8"))
        if not isinstance(dashboard, dict):
            failures.add(args.dashboard, "is not a JSON object")
            dashboard = None
    except OSError as e:
        failures.add(args.dashboard, f"cannot read: {e.strerror}")
    except ValueError as e:
        failures.add(args.dashboard, f"is not valid JSON: {e}")

    if dashboard is not None:
        # Without a provisioned uid, the references are only checked for presence.
        count = check_dashboard(dashboard, uid, failures)
        expressions = collect_expressions(dashboard)
        print(f"static: dashboard '{dashboard.get('title')}' uid {dashboard.get('uid')} "
              f"schemaVersion {dashboard.get('schemaVersion')}: {count} panels, "
              f"{len(expressions)} expressions; datasource uid {uid}; "
              f"dashboards loaded from {provider_path}")
    if failures:
        print(f"static checks: {len(failures.items)} failed")
        for item in failures.items:
            print(f"  FAIL {item}")
        return 1
    print("static checks: all passed")
    if not args.prometheus:
        return 0

    range_seconds = dashboard_range_seconds(dashboard)
    prom = Prometheus(args.prometheus, args.timeout)
    deadline = time.monotonic() + args.wait
    attempt = 0
    while True:
        attempt += 1
        values = builtin_values(args, range_seconds)
        values.update(variable_values(dashboard, args.var_values))
        results = run_live(prom, expressions, values, range_seconds)
        failed = [line for ok, line in results if not ok]
        remaining = deadline - time.monotonic()
        if not failed or remaining <= 0:
            break
        waiting = ", ".join(line.split(":")[0][6:] for line in failed[:3])
        more = f" and {len(failed) - 3} more" if len(failed) > 3 else ""
        print(f"live: {len(failed)} of {len(results)} expressions without data "
              f"(attempt {attempt}: {waiting}{more}); retrying for {remaining:.0f} s more",
              flush=True)
        time.sleep(min(2.0, max(0.1, remaining)))

    print(f"live checks against {args.prometheus} ($__rate_interval={args.rate_interval}, "
          f"$__interval={args.interval}, $__range={args.range}, annotations over the last "
          f"{range_seconds:g} s):")
    for _, line in results:
        print(f"  {line}")
    if failed:
        print(f"live checks: {len(failed)} of {len(results)} failed:")
        for line in failed:
            print(f"  {line}")
        return 1
    print(f"live checks: all {len(results)} passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
