"""JUnit XML (what CI systems show as test results): one test suite per file, one failing test case per finding,
and an errored test case per file that could not be checked."""
from __future__ import annotations

from typing import Iterable
from xml.etree import ElementTree as ET

from neuron_migrate.rules.model import Finding


def junit_xml(findings: Iterable[Finding], errors: list, n_files: int = 0) -> str:
    findings = sorted(findings, key=lambda f: f.sort_key())
    by_file: dict = {}
    for f in findings:
        by_file.setdefault(f.path, []).append(f)
    suites = ET.Element("testsuites", name="neuron-migrate", tests=str(len(findings) + len(errors)),
                        failures=str(len(findings)), errors=str(len(errors)))
    for path, items in by_file.items():
        suite = ET.SubElement(suites, "testsuite", name=path, tests=str(len(items)), failures=str(len(items)), errors="0")
        for f in items:
            case = ET.SubElement(suite, "testcase", name=f"{f.rule.code} {f.rule.name}", classname=path,
                                 file=path, line=str(f.span.line))
            failure = ET.SubElement(case, "failure", message=f.message, type=f.severity.value)
            failure.text = f"{path}:{f.span.line}:{f.span.col + 1}: {f.rule.code} {f.message}" + (f"\nnote: {f.note}" if f.note else "")
    if errors:
        suite = ET.SubElement(suites, "testsuite", name="errors", tests=str(len(errors)), failures="0", errors=str(len(errors)))
        for path, msg in errors:
            case = ET.SubElement(suite, "testcase", name=path or "neuron-migrate", classname=path or "neuron-migrate")
            ET.SubElement(case, "error", message=msg).text = msg
    if not by_file and not errors:
        suite = ET.SubElement(suites, "testsuite", name="neuron-migrate", tests="1", failures="0", errors="0")
        ET.SubElement(suite, "testcase", name=f"no findings in {n_files} file{'s' if n_files != 1 else ''}", classname="neuron-migrate")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n"
