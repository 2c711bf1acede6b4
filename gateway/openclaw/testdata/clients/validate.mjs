// Validates every frame the gateway sent (its openclawClients.traceFile, one {method, frame} a
// line) against the JSON Schemas bundled in the pinned openclaw package: the frame itself
// (ResponseFrame / EventFrame), hello-ok, each event's payload schema and each method's result
// schema where the package has one. Usage: node validate.mjs OPENCLAW_DIST TRACE_FILE.
// Prints {frames, checked: {schema: n}, errors: [...]} and exits 1 on any error.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createRequire } from 'node:module';

const [dist, traceFile] = process.argv.slice(2);
const require = createRequire(join(dist, '..', 'package.json'));
const Ajv = require('ajv').default ?? require('ajv');
const ajv = new Ajv({ strict: false, allErrors: false, validateFormats: false });

const pascal = (m) => m.split(/[._-]/).map((p) => p[0].toUpperCase() + p.slice(1)).join('');
const lines = readFileSync(traceFile, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l));
const wanted = new Set(['ResponseFrameSchema', 'EventFrameSchema', 'HelloOkSchema', 'ChatEventSchema', 'AgentEventSchema',
  'TickEventSchema', 'ShutdownEventSchema', 'SessionPlacementSchema', 'SessionRowSchema', 'ErrorShapeSchema']);
for (const l of lines) if (l.method) wanted.add(pascal(l.method) + 'ResultSchema');

// Import only the chunks that export a wanted schema (names change per release; the exports
// read "XSchema as alias").
const schemas = {};
for (const f of readdirSync(dist)) {
  if (!f.endsWith('.mjs')) continue;
  const src = readFileSync(join(dist, f), 'utf8');
  const found = [...src.matchAll(/(\w+Schema) as ([\w$]+)/g)].filter(([, n]) => wanted.has(n) && !schemas[n]);
  if (found.length === 0) continue;
  let mod;
  try { mod = await import(join(dist, f)); } catch { continue; }
  for (const [, name, alias] of found) if (mod[alias] && typeof mod[alias] === 'object') schemas[name] = JSON.parse(JSON.stringify(mod[alias]));
}
const compiled = {};
const check = (name, value, where, errors, checked) => {
  const s = schemas[name];
  if (!s) return;
  compiled[name] ??= ajv.compile(s);
  checked[name] = (checked[name] ?? 0) + 1;
  if (!compiled[name](value)) errors.push({ where, schema: name, errors: compiled[name].errors.slice(0, 3), value: JSON.stringify(value).slice(0, 400) });
};
const errors = [];
const checked = {};
const eventSchema = { chat: 'ChatEventSchema', agent: 'AgentEventSchema', tick: 'TickEventSchema', shutdown: 'ShutdownEventSchema' };
lines.forEach(({ method, frame }, i) => {
  const where = `line ${i + 1} (${frame.type} ${frame.event ?? method})`;
  if (frame.type === 'res') {
    check('ResponseFrameSchema', frame, where, errors, checked);
    if (!frame.ok) return;
    if (method === 'connect') check('HelloOkSchema', frame.payload, where, errors, checked);
    else check(pascal(method) + 'ResultSchema', frame.payload, where, errors, checked);
    for (const row of frame.payload?.sessions ?? []) {
      check('SessionRowSchema', row, where + ' session row', errors, checked);
      if (row.placement) check('SessionPlacementSchema', row.placement, where + ' placement', errors, checked);
    }
  } else {
    check('EventFrameSchema', frame, where, errors, checked);
    if (eventSchema[frame.event]) check(eventSchema[frame.event], frame.payload, where, errors, checked);
  }
});
const missing = ['ResponseFrameSchema', 'EventFrameSchema', 'ChatEventSchema', 'AgentEventSchema'].filter((n) => !schemas[n]);
console.log(JSON.stringify({ frames: lines.length, checked, missing, errors: errors.slice(0, 20), errorCount: errors.length }));
process.exit(errors.length > 0 || missing.length > 0 ? 1 : 0);
