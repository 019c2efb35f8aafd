// Runs labextension/src/format.ts's formatters over tests/format_cases.json and prints one JSON
// line per case: {"index": i, "got": "..."} (tests/test_format_cases.py compares them).
// Usage: node tests/format_cases_ts.js <path of the typescript package> <format.ts> <cases.json>
'use strict';
const fs = require('fs');
const Module = require('module');
const [typescriptDir, source, casesPath] = process.argv.slice(2);
const ts = require(typescriptDir);
const js = ts.transpileModule(fs.readFileSync(source, 'utf8'), {
  compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2019 }
}).outputText;
const mod = new Module(source);
mod._compile(js, source);
const special = { NaN: NaN, Infinity: Infinity, '-Infinity': -Infinity };
const { cases } = JSON.parse(fs.readFileSync(casesPath, 'utf8'));
cases.forEach((c, index) => {
  const args = c.args.map(a => (typeof a === 'string' && a in special ? special[a] : a));
  process.stdout.write(JSON.stringify({ index, got: mod.exports[c.fn](...args) }) + '\n');
});
