#!/usr/bin/env python3
"""scripts/skipped_tests.py JUNIT...: which tests were skipped and why, from the JUnit files ctest
writes (`ctest --output-junit FILE`, one per preset; scripts/test.sh passes them). Prints one line
per skipped test - the preset (the file's build folder), the test, and the reason its output gave
(GoogleTest's GTEST_SKIP message, or the line an exit-77 script printed) - and ends with the count,
so a CI log ends saying what did not run. Standard library only (runs on the system python3).
"""
import os
import re
import sys
import xml.etree.ElementTree as ET


def reason(out: str, fallback: str) -> str:
    """The reason in a skipped test's output: GTEST_SKIP's message, else the library's refusal of
    an FP8KIT_ISA path this CPU lacks (tests/CMakeLists.txt's SKIP_REGULAR_EXPRESSION), else a
    line saying 'skip'."""
    m = re.search(r": Skipped\n(.*?)\n\[  SKIPPED \]", out, re.S)
    if m and m.group(1).strip():
        return " ".join(m.group(1).split())
    lines = [line.strip() for line in out.splitlines() if line.strip() and not line.startswith("[  SKIPPED ]")]
    refused = [line for line in lines if "does not support it" in line]
    if refused:
        return refused[0]
    said = [line for line in lines if "skip" in line.lower()]
    return (said or lines or [fallback])[-1]


def main() -> int:
    rows = []
    for path in sys.argv[1:]:
        if not os.path.exists(path):
            continue  # that preset did not get to its tests (its build failed: reported above)
        preset = os.path.basename(os.path.dirname(os.path.abspath(path)))
        for case in ET.parse(path).getroot().iter("testcase"):
            skipped = case.find("skipped")
            if case.get("status") != "notrun" and skipped is None:
                continue
            out = case.findtext("system-out") or ""
            why = reason(out, skipped.get("message", "no reason given") if skipped is not None else "not run")
            rows.append(f"  {preset}: {case.get('name')}: {why}")
    print("== skipped tests ==")
    for row in rows:
        print(row)
    print(f"== {len(rows)} test(s) skipped ==")
    return 0


if __name__ == "__main__":
    sys.exit(main())
