#!/usr/bin/python3
"""Writes the seed corpus of fleet's fuzz targets into fuzz/corpus/<target>/.

Run with Debian's interpreter (it needs python3-msgpack):

    /usr/bin/python3 fuzz/make_corpus.py

The output is deterministic and committed. Files this script does not name
(crash reproducers added by hand, inputs kept by `fuzz/run.sh --merge`) are
left alone; --clean removes every file first.

Contents: a valid message of every protocol command; the hostile msgpack
cases (huge array/map/str/bin headers with no body, thousands of nested
headers, 100000 levels of nesting, trailing bytes, ext types, a wrong type in
every field); Prometheus pages with huge numbers, NaN/Inf, escapes, long
label values, broken braces and 10^5 samples; Prometheus API answers with
deep nesting, huge numbers, wrong types and truncations.
"""

import argparse
import json
import os
import shutil
import struct
import sys

import msgpack

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

VERSION = 1
# Command numbers, as in common/protocol.h.
SUBMIT, ACK, RESULT, FETCH = 1, 2, 3, 4
OBJECT_REQUEST, OBJECT_REPLY = 5, 6
HELLO, WELCOME, DISPATCH, DONE, DRAIN, BYE, STOP, HEARTBEAT, RESET = range(10, 19)
OBJECT_GET, OBJECT_DATA = 19, 20
CONTROL, CONTROL_REPLY, WORKERS_REPLY, STATS_REPLY = 30, 31, 32, 33
ERROR = 40


def pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


def msg(command, *fields):
    return pack([VERSION, command, *fields])


# A valid message of every command, as fields after [version, command]. Binary
# payloads are bytes (packed as bin), ids and texts str.
VALID = {
    "submit": (SUBMIT, [[["b1", "default", b"\x93\x01\x02\x03"], ["b2", "", b""]]]),
    "ack": (ACK, [["b1", "b2"], [["b3", 5, "queue full"]]]),
    "result": (RESULT, [[["b1", 0, 1, b"\xc3", ""], ["b2", 1, 3, b"", "dead-lettered"]]]),
    "fetch": (FETCH, [["b1", "b2", "b3"]]),
    "hello": (HELLO, ["worker-1", 4, 3, ["default", "gpu"]]),
    "welcome": (WELCOME, [1000, 3]),
    "dispatch": (DISPATCH, [[["b1", "default", 1, b"payload"], ["b2", "gpu", 2, b""]]]),
    "done": (DONE, [2, [["b1", 1, 0, b"out", ""], ["b2", 2, 1, b"", "handler raised"]]]),
    "drain": (DRAIN, []),
    "bye": (BYE, []),
    "stop": (STOP, ["retired by the autoscaler"]),
    "heartbeat": (HEARTBEAT, []),
    "reset": (RESET, ["unknown worker"]),
    "control": (CONTROL, [7, "retire-if-idle", ["worker-1"]]),
    "control_reply": (CONTROL_REPLY, [7, 7, "busy"]),
    "workers_reply": (WORKERS_REPLY, [8, [["worker-1", "idle", 4, 0, 12.5, 100, 2],
                                         ["worker-2", "busy", 1, 1, 0, 0, 0]]]),
    "stats_reply": (STATS_REPLY, [9, {"default": 3, "gpu": 0},
                                  {"submitted_total": 10, "queue_bytes": 1.5e6,
                                   "neg": -2}]),
    "error": (ERROR, [4, "frame too large"]),
    "object_request": (OBJECT_REQUEST, [2**40, "b1", b"\x01" * 32, 4 << 20, 4 << 20]),
    "object_reply": (OBJECT_REPLY, [2**40, 0, 40 << 20, b"chunk", ""]),
    "object_get": (OBJECT_GET, [7, "b1", b"\x01" * 32, 0, 1 << 20]),
    "object_data": (OBJECT_DATA, [7, 2, 0, 0, b"", "producer gone"]),
}

# A value of the wrong type for a field, by the kind of value it replaces.
WRONG = {
    str: [None, 7, b"bytes"],
    bytes: [None, 7],
    int: [None, "7", -1, 1.5, True],
    float: [None, "1.5", True],
    list: [None, {"a": 1}, "x"],
    dict: [None, ["a", 1]],
}


def wrong_type_cases():
    """Each field of each message (top level and first list item) replaced by
    values of other types."""
    out = {}
    for name, (command, fields) in VALID.items():
        for i, value in enumerate(fields):
            for j, bad in enumerate(WRONG[type(value)]):
                f = list(fields)
                f[i] = bad
                out[f"wrongtype_{name}_f{i}_{j}"] = msg(command, *f)
            if isinstance(value, list) and value and isinstance(value[0], list):
                for k, inner in enumerate(value[0]):
                    for j, bad in enumerate(WRONG[type(inner)][:2]):
                        item = list(value[0])
                        item[k] = bad
                        f = list(fields)
                        f[i] = [item] + value[1:]
                        out[f"wrongtype_{name}_f{i}_item{k}_{j}"] = msg(command, *f)
            if isinstance(value, dict):
                f = list(fields)
                f[i] = {1: 2}
                out[f"wrongtype_{name}_f{i}_intkey"] = msg(command, *f)
                f[i] = {"q": "deep"}
                out[f"wrongtype_{name}_f{i}_strval"] = msg(command, *f)
    return out


def protocol_cases():
    c = {}
    for name, (command, fields) in VALID.items():
        c[f"valid_{name}"] = msg(command, *fields)
    # Payload packed as str by a hand-written producer: accepted.
    c["valid_submit_str_payload"] = msg(SUBMIT, [["b1", "q", "text payload"]])
    c["valid_submit_empty"] = msg(SUBMIT, [])
    # Integers in wider headers than needed, floats where ints may be.
    c["valid_hello_wide_ints"] = (b"\x96\xce\x00\x00\x00\x01\xcf\x00\x00\x00\x00\x00\x00\x00\x0a"
                                  + pack("w") + b"\xce\x00\x00\x00\x04\xcd\x00\x03\x90")
    c["valid_workers_reply_float32"] = (b"\x94\x01\x20\x01\x91\x97" + pack("w") + pack("idle")
                                        + b"\x01\x00\xca" + struct.pack(">f", 2.5) + b"\x00\x00")

    # Hostile headers: each announces far more than follows.
    c["hostile_array32_no_body"] = b"\xdd\xff\xff\xff\xff"
    c["hostile_array32_in_submit"] = b"\x93\x01\x01\xdd\xff\xff\xff\xff"
    c["hostile_array32_65537_items"] = b"\x93\x01\x04\xdd\x00\x01\x00\x01" + b"\xa1a" * 8
    c["hostile_array16_max"] = b"\x93\x01\x04\xdc\xff\xff"
    c["hostile_map32_no_body"] = b"\xdf\xff\xff\xff\xff"
    c["hostile_map32_in_stats"] = b"\x95\x01\x21\x01\xdf\xff\xff\xff\xff"
    c["hostile_str32_1gib_truncated"] = b"\xdb\x40\x00\x00\x00abc"
    c["hostile_str32_in_stop"] = b"\x93\x01\x10\xdb\x40\x00\x00\x00abc"
    c["hostile_str32_max"] = b"\x93\x01\x10\xdb\xff\xff\xff\xffabc"
    c["hostile_bin32_huge"] = b"\xc6\xff\xff\xff\xffxyz"
    c["hostile_bin32_in_submit"] = (b"\x93\x01\x01\x91\x93" + pack("b1") + pack("q")
                                    + b"\xc6\x7f\xff\xff\xffxyz")
    c["hostile_ext32_huge"] = b"\xc9\xff\xff\xff\xff\x01abc"
    c["hostile_ext_fixext1"] = b"\x93\x01\x10\xd4\x05\x00"
    c["hostile_ext_fixext16"] = b"\x93\x01\x10\xd8\x05" + b"\x00" * 16
    c["hostile_ext8"] = b"\x93\x01\x10\xc7\x03\x05abc"
    c["hostile_ext_timestamp"] = b"\x93\x01\x10\xd6\xff\x00\x00\x00\x00"
    c["hostile_ext_as_payload"] = (b"\x93\x01\x01\x91\x93" + pack("b1") + pack("q")
                                   + b"\xd5\x01\x00\x00")
    # Thousands of nested headers, each announcing 2^32-1 elements.
    c["hostile_nested_array32_headers_x4000"] = b"\xdd\xff\xff\xff\xff" * 4000
    c["hostile_nested_map32_headers_x1000"] = b"\xdf\xff\xff\xff\xff\xa1k" * 1000
    c["hostile_nested_array16_headers_x4000"] = b"\x93\x01\x01" + b"\xdc\x00\x01" * 4000
    # Deep nesting: 100000 levels of one-element arrays, and of maps.
    c["hostile_deep_array_100000"] = b"\x91" * 100000
    c["hostile_deep_map_5000"] = b"\x81\xa1k" * 5000 + b"\xc0"
    c["hostile_deep_in_field"] = b"\x94\x01\x1e\x07" + b"\x91" * 64 + b"\xc0"
    # Trailing bytes after a valid message.
    hb = msg(HEARTBEAT)
    c["hostile_trailing_nul"] = hb + b"\x00"
    c["hostile_trailing_second_message"] = hb + hb
    c["hostile_trailing_garbage"] = msg(STOP, "x") + b"\xc1\xff\xfe"
    c["hostile_trailing_truncated_header"] = hb + b"\xdd\xff\xff"
    # Truncated valid messages, at every byte of one.
    sub = c["valid_submit"]
    for n in range(1, len(sub), 3):
        c[f"truncated_submit_{n:03d}"] = sub[:n]
    # Envelope problems.
    c["envelope_empty_array"] = pack([])
    c["envelope_version_only"] = pack([1])
    c["envelope_not_array"] = pack({"v": 1, "c": 17})
    c["envelope_fixint"] = b"\x01"
    c["envelope_reserved_c1"] = b"\xc1"
    c["envelope_version_2"] = pack([2, HEARTBEAT])
    c["envelope_version_0"] = pack([0, HEARTBEAT])
    c["envelope_version_negative"] = pack([-1, HEARTBEAT])
    c["envelope_version_u64max"] = pack([2**64 - 1, HEARTBEAT])
    c["envelope_command_99"] = pack([1, 99])
    c["envelope_command_0"] = pack([1, 0])
    c["envelope_command_21"] = pack([1, 21])
    c["envelope_command_u64max"] = pack([1, 2**64 - 1])
    c["envelope_command_float"] = pack([1, 17.0])
    c["envelope_extra_field"] = pack([1, HEARTBEAT, 0])
    c["envelope_missing_field"] = pack([1, WELCOME, 1000])
    # Numbers at and past their ranges.
    c["range_uint32_overflow"] = msg(WELCOME, 2**32, 3)
    c["range_uint32_max"] = msg(WELCOME, 2**32 - 1, 2**32 - 1)
    c["range_u64_max_request_id"] = msg(CONTROL, 2**64 - 1, "stats", [])
    c["range_outcome_3"] = msg(RESULT, [["b1", 3, 1, b"", ""]])
    c["range_outcome_u32max"] = msg(DONE, 1, [["b1", 1, 2**32 - 1, b"", ""]])
    c["range_error_code_unknown"] = msg(ERROR, 12345, "?")
    c["range_idle_u64max"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, 2**64 - 1, 0, 0]])
    c["range_idle_2pow64_float"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, float(2**64), 0, 0]])
    c["range_idle_2pow63_float"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, float(2**63), 0, 0]])
    c["range_idle_int64min"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, -2**63, 0, 0]])
    c["range_idle_nan"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, float("nan"), 0, 0]])
    c["range_idle_inf"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, float("inf"), 0, 0]])
    c["range_idle_negzero"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, -0.0, 0, 0]])
    c["range_idle_1e300"] = msg(WORKERS_REPLY, 1, [["w", "idle", 1, 0, 1e300, 0, 0]])
    c["range_stats_values"] = msg(STATS_REPLY, 1, {}, {"a": float(2**64), "b": -1e308,
                                                      "c": float("-inf"), "d": -2**63,
                                                      "e": 2**64 - 1, "f": float("nan")})
    # Sizes at and past the default limits (256-byte ids).
    c["limit_id_256"] = msg(FETCH, ["i" * 256])
    c["limit_id_257"] = msg(FETCH, ["i" * 257])
    c["limit_worker_id_257"] = msg(HELLO, "w" * 257, 1, 1, [])
    c["limit_tight_5_items"] = msg(FETCH, ["a", "b", "c", "d", "e"])
    c["limit_tight_id_9"] = msg(FETCH, ["123456789"])
    c["limit_tight_payload_65"] = msg(SUBMIT, [["b", "q", b"p" * 65]])
    c["limit_tight_text_33"] = msg(STOP, "r" * 33)
    c["limit_duplicate_stats_keys"] = (b"\x95\x01\x21\x01\x82" + pack("q") + b"\x01" + pack("q")
                                       + b"\x02\x80")
    c.update(wrong_type_cases())
    return c


def prom_text_cases():
    c = {}
    c["valid_broker_page"] = (
        "# HELP fleet_queue_depth Batches waiting, by queue.\n"
        "# TYPE fleet_queue_depth gauge\n"
        'fleet_queue_depth{queue="default"} 12\n'
        'fleet_queue_depth{queue="gpu"} 0\n'
        "# HELP fleet_batches_total Batches by outcome.\n"
        "# TYPE fleet_batches_total counter\n"
        'fleet_batches_total{outcome="ok"} 1027 1700000000000\n'
        'fleet_batches_total{outcome="failed"} 3 1700000000000\n'
        "# TYPE fleet_batch_seconds histogram\n"
        'fleet_batch_seconds_bucket{le="0.1"} 5\n'
        'fleet_batch_seconds_bucket{le="+Inf"} 9\n'
        "fleet_batch_seconds_sum 3.25\n"
        "fleet_batch_seconds_count 9\n"
        "# TYPE rpc summary\n"
        'rpc{quantile="0.5"} 0.01\n'
        'rpc{quantile="0.99"} NaN\n'
        "rpc_sum 1.5\n"
        "rpc_count 100\n"
        "# A plain comment\n"
        "\n"
        "fleet_metrics_refresh_timestamp_seconds 1.7e9\n")
    c["valid_crlf_tabs"] = "a\t1\r\n\tb{x=\"1\",}\t2\r\nc { y = \"z\" } 3 -5\r\n"
    c["valid_help_escapes"] = "# HELP h a \\\\ b \\n c \\x d\n# TYPE h gauge\nh 1\n"
    c["huge_numbers"] = ("a 1e308\nb 1e309\nc -1e309\nd 1e-400\ne 18446744073709551616\n"
                         "f " + "9" * 400 + "\ng 0." + "0" * 400 + "1\n"
                         "h 0x1p3\ni 1_000\nj 1e\nk .5\nl 5.\nm +.5e+3\nn --1\n"
                         "o 1 9223372036854775807\np 1 9223372036854775808\n"
                         "q 1 -9223372036854775808\nr 1 +5\ns 1 ++5\nt 1 1.5\n")
    c["nan_inf"] = ("a NaN\nb nan\nc +Inf\nd -Inf\ne inf\nf Infinity\ng -infinity\n"
                    "h -NaN\ni nan(123)\nj +nan\nk INF\nl Inff\nm +-Inf\n")
    c["escapes"] = ('a{v="q\\"uote"} 1\nb{v="back\\\\slash"} 2\nc{v="new\\nline"} 3\n'
                    'd{v="tab\\t"} 4\ne{v="trail\\"} 5\nf{v="\\\\\\"\\n"} 6\n'
                    'g{v="raw\ttab"} 7\nh{v="é€"} 8\n')
    for n in (1023, 1024, 1025, 5000):
        c[f"long_label_value_{n}"] = 'a{v="' + "x" * n + '"} 1\n'
    c["long_label_value_escaped_1024"] = 'a{v="' + "\\n" * 1024 + '"} 1\n'
    c["long_metric_name_1025"] = "m" * 1025 + " 1\n"
    c["long_label_name_1025"] = "a{" + "l" * 1025 + '="v"} 1\n'
    c["many_labels_65"] = "a{" + ",".join(f'l{i}="v"' for i in range(65)) + "} 1\n"
    c["missing_braces"] = ('a{b="c" 1\na b="c"} 1\na{ 1\na} 1\na{b="c"}} 1\n{b="c"} 1\n'
                           'a{b=c} 1\na{b="c",,d="e"} 1\na{="c"} 1\na{b"c"} 1\na{b="c\n'
                           'a{b="c"}1\na{b="c" d="e"} 1\n')
    c["bad_lines"] = ("a-b 1\n1a 2\na\na 1 2 3\na 1 ts\n# TYPE a nonsense\n# TYPE a\n"
                      "# TYPE b counter\n# TYPE b gauge\n# HELP b x\n# HELP b y\n"
                      "# HELP 1bad x\n# TYPE c gauge extra\na{b=\"1\",b=\"2\"} 1\n")
    c["histogram_without_le"] = ("# TYPE h histogram\nh_bucket 1\nh_bucket{le=\"x\"} 1\n"
                                 "h_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n")
    c["summary_without_quantile"] = "# TYPE s summary\ns 1\ns{quantile=\"q\"} 1\ns_sum 1\n"
    c["type_after_samples"] = "h_bucket 1\n# TYPE h histogram\nh_bucket 2\n"
    c["nul_and_control_bytes"] = "a\x00 1\nb{v=\"\x00\x01\x7f\"} 2\nc 3\x00\n\r\n\r\r\n# \x00\n"
    c["help_ends_in_cr"] = "# HELP a text\r\r\n# TYPE a gauge\na 1\n"
    c["only_newlines"] = "\n" * 1000
    c["empty"] = ""
    c["no_final_newline"] = "a 1"
    c["series_2000_distinct"] = "".join(f"s{i} {i}\n" for i in range(2000))
    c["samples_100000"] = "a 1\n" * 100000
    out = {k: v.encode("utf-8") for k, v in c.items()}
    out["invalid_utf8"] = b'a{v="\xff\xfe\xc3"} 1\n# HELP a \xff\n\xff 2\n'
    return out


def prom_api_cases():
    c = {}

    def dump(obj):
        return json.dumps(obj, separators=(",", ":")).encode()

    vector = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"__name__": "fleet_queue_depth", "queue": "default"},
         "value": [1700000000.123, "12"]},
        {"metric": {"queue": "gpu"}, "value": [1700000000, "NaN"]},
        {"metric": {}, "value": [1700000000, "+Inf"]},
        {"value": [1700000000, "-Inf"]}]}}
    c["valid_vector"] = dump(vector)
    c["valid_vector_empty"] = dump({"status": "success",
                                    "data": {"resultType": "vector", "result": []}})
    c["valid_scalar"] = dump({"status": "success",
                              "data": {"resultType": "scalar", "result": [1700000000, "3.5"]}})
    c["valid_warnings"] = dump({"status": "success", "warnings": ["w1", 7, "w2"],
                                "data": {"resultType": "vector", "result": []}})
    c["valid_error"] = dump({"status": "error", "errorType": "bad_data",
                             "error": "parse error at char 3"})
    c["valid_error_no_message"] = dump({"status": "error"})
    c["valid_pretty"] = json.dumps(vector, indent=2).encode()
    c["unsupported_matrix"] = dump({"status": "success", "data": {"resultType": "matrix",
                                    "result": [{"metric": {}, "values": [[1, "1"]]}]}})
    c["unsupported_string"] = dump({"status": "success",
                                    "data": {"resultType": "string", "result": [1, "x"]}})
    # Deep nesting.
    c["deep_array_20000"] = b"[" * 20000
    c["deep_array_closed_5000"] = b"[" * 5000 + b"]" * 5000
    c["deep_object_3000"] = b'{"a":' * 3000 + b"1" + b"}" * 3000
    c["deep_in_result_40"] = (b'{"status":"success","data":{"resultType":"vector","result":'
                              + b"[" * 40 + b"]" * 40 + b"}}")
    c["deep_brackets_in_strings"] = dump({"status": "success", "x": "[" * 5000,
                                          "data": {"resultType": "vector", "result": []}})
    c["deep_escaped_quote_in_string"] = (b'{"status":"success","x":"\\"[[[[","data":'
                                         b'{"resultType":"vector","result":[]}}')
    # Huge numbers.
    def one(ts, value):
        return (b'{"status":"success","data":{"resultType":"vector","result":'
                b'[{"metric":{"a":"b"},"value":[' + ts + b',' + value + b']}]}}')
    c["huge_timestamp_1e400"] = one(b"1e400", b'"1"')
    c["huge_timestamp_neg_1e400"] = one(b"-1e400", b'"1"')
    c["huge_timestamp_1e308"] = one(b"1e308", b'"1"')
    c["huge_timestamp_u64"] = one(b"18446744073709551615", b'"1"')
    c["huge_timestamp_2pow64"] = one(b"18446744073709551616", b'"1"')
    c["huge_timestamp_digits"] = one(b"1" * 400, b'"1"')
    c["huge_timestamp_neg_i64"] = one(b"-9223372036854775809", b'"1"')
    c["huge_value_1e400"] = one(b"1", b'"1e400"')
    c["huge_value_tiny"] = one(b"1", b'"1e-400"')
    c["huge_value_number"] = one(b"1", b"1e308")
    c["value_nan_lower"] = one(b"1", b'"nan"')
    c["value_empty"] = one(b"1", b'""')
    c["value_hex"] = one(b"1", b'"0x10"')
    # Wrong types.
    c["wrong_root_array"] = dump([vector])
    c["wrong_root_string"] = dump("success")
    c["wrong_status_number"] = dump({"status": 1, "data": vector["data"]})
    c["wrong_status_unknown"] = dump({"status": "maybe", "data": vector["data"]})
    c["wrong_data_array"] = dump({"status": "success", "data": []})
    c["wrong_result_type_number"] = dump({"status": "success",
                                          "data": {"resultType": 1, "result": []}})
    c["wrong_result_object"] = dump({"status": "success",
                                     "data": {"resultType": "vector", "result": {}}})
    c["wrong_element_array"] = dump({"status": "success",
                                     "data": {"resultType": "vector", "result": [[1, "1"]]}})
    c["wrong_value_three"] = dump({"status": "success", "data": {"resultType": "vector",
                                   "result": [{"value": [1, "1", 2]}]}})
    c["wrong_value_ts_string"] = dump({"status": "success", "data": {"resultType": "vector",
                                       "result": [{"value": ["1", "1"]}]}})
    c["wrong_value_null"] = dump({"status": "success", "data": {"resultType": "vector",
                                  "result": [{"value": [1, None]}]}})
    c["wrong_label_number"] = dump({"status": "success", "data": {"resultType": "vector",
                                    "result": [{"metric": {"a": 1}, "value": [1, "1"]}]}})
    c["wrong_metric_array"] = dump({"status": "success", "data": {"resultType": "vector",
                                    "result": [{"metric": ["a"], "value": [1, "1"]}]}})
    c["wrong_scalar_object"] = dump({"status": "success",
                                     "data": {"resultType": "scalar", "result": {"v": 1}}})
    c["wrong_error_types"] = dump({"status": "error", "errorType": 5, "error": ["x"]})
    c["duplicate_keys"] = (b'{"status":"error","status":"success","data":'
                           b'{"resultType":"scalar","result":[1,"2"]}}')
    c["duplicate_labels"] = (b'{"status":"success","data":{"resultType":"vector","result":'
                             b'[{"metric":{"a":"1","a":"2"},"value":[1,"1"]}]}}')
    # Truncated JSON, and text that is not JSON.
    full = c["valid_vector"]
    for n in (1, 2, 10, 25, 60, 100, len(full) // 2, len(full) - 2, len(full) - 1):
        c[f"truncated_{n:03d}"] = full[:n]
    c["not_json_empty"] = b""
    c["not_json_html"] = b"<html><body>502 Bad Gateway</body></html>"
    c["not_json_trailing"] = c["valid_scalar"] + b" {}"
    c["not_json_nul"] = c["valid_scalar"][:20] + b"\x00" + c["valid_scalar"][20:]
    c["utf8_invalid_in_label"] = (b'{"status":"success","data":{"resultType":"vector","result":'
                                  b'[{"metric":{"a":"\xff\xfe"},"value":[1,"1"]}]}}')
    c["utf8_escapes_in_label"] = (b'{"status":"success","data":{"resultType":"vector","result":'
                                  b'[{"metric":{"a\\u0000":"\\ud83d\\ude00\\u00e9"},'
                                  b'"value":[1,"1"]}]}}')
    c["utf8_lone_surrogate"] = (b'{"status":"success","data":{"resultType":"vector","result":'
                                b'[{"metric":{"a":"\\ud800"},"value":[1,"1"]}]}}')
    c["many_samples_3"] = dump({"status": "success", "data": {"resultType": "vector",
                                "result": [{"value": [i, str(i)]} for i in range(3)]}})
    return c


def write(target, cases, force):
    d = os.path.join(ROOT, target)
    if force and os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d, exist_ok=True)
    total = 0
    for name, data in sorted(cases.items()):
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
        total += len(data)
    print(f"{target}: {len(cases)} files, {total} bytes")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clean", action="store_true",
                    help="remove every file of fuzz/corpus/<target>/ first")
    args = ap.parse_args()
    write("fuzz_protocol", protocol_cases(), args.clean)
    write("fuzz_prom_text", prom_text_cases(), args.clean)
    write("fuzz_prom_api", prom_api_cases(), args.clean)
    return 0


if __name__ == "__main__":
    sys.exit(main())
