// tour.py with the E2B JavaScript SDK: one unmodified E2B program, nothing of Corral imported, the same steps and the
// same JSON report.
//
// Run it where Node resolves 'e2b' (ES modules ignore NODE_PATH; Node looks in node_modules next to the file):
//   npm install e2b                      # or copy this file next to tests/e2e/js/node_modules (`make bootstrap`)
//   E2B_API_URL=http://127.0.0.1:8000/e2b E2B_SANDBOX_URL=http://127.0.0.1:8000/e2b/envd E2B_API_KEY=... \
//     node tour.mjs
// Start the server with CORRAL_SANDBOX_DOMAIN for preview hosts. It creates a sandbox, types into a PTY, watches a
// directory, serves HTTP on port 3000 and fetches it through getHost, denies one address and allows another, builds a
// template from the local base image, snapshots, forks and reads metrics. It prints one JSON line of what it saw and
// removes everything it made; any error ends it with a nonzero exit and its stack.
//
// Without wildcard DNS for the preview domain, the fetch goes to the E2B API's host with the preview host in the Host
// header, which is what a wildcard DNS name pointing at Corral would do.
import { randomUUID } from 'node:crypto'
import http from 'node:http'
import https from 'node:https'
import { CommandExitError, Sandbox, Template } from 'e2b'

// Poll `check` until it returns something truthy, or throw once `seconds` pass.
async function until(what, check, seconds = 60) {
  const deadline = Date.now() + seconds * 1000
  for (;;) {
    const value = await check()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`${what}: not seen within ${seconds} s`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

// GET `url` from inside the sandbox: the body, or how it failed.
async function fetchInside(sandbox, url) {
  try {
    return (await sandbox.commands.run(`curl -sS --max-time 5 ${url}`, { timeoutMs: 30_000 })).stdout.trim()
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error
    return `failed (${error.exitCode})`
  }
}

// GET `path` on a preview host, sent to the E2B API's own address. Node's fetch refuses a Host header, hence http.
function fetchPreview(host, path) {
  const api = new URL(process.env.E2B_API_URL)
  if (api.protocol !== 'http:' && api.protocol !== 'https:') {
    throw new Error(`E2B_API_URL must be an http(s) URL, got ${api.protocol}`)
  }
  const client = api.protocol === 'https:' ? https : http
  return new Promise((resolve, reject) => {
    const request = client.request(
      { host: api.hostname, port: api.port, path, headers: { Host: host }, timeout: 30_000 },
      (answer) => {
        let body = ''
        answer.setEncoding('utf8')
        answer.on('data', (chunk) => (body += chunk))
        answer.on('end', () =>
          answer.statusCode === 200 ? resolve(body) : reject(new Error(`HTTP ${answer.statusCode}: ${body}`)),
        )
      },
    )
    request.on('error', reject)
    request.on('timeout', () => request.destroy(new Error(`no answer from ${host} within 30 s`)))
    request.end()
  })
}

// Sandboxes serving who-they-are on port 8080, and their addresses: somewhere for the network rules to point.
async function webServers(count, made) {
  const servers = []
  const addresses = []
  for (let index = 0; index < count; index++) {
    const server = await Sandbox.create()
    made.push(server)
    servers.push(server)
    await server.files.write('/home/user/who/who', `server-${index}\n`)
    await server.commands.run('python3 -m http.server 8080 --bind 0.0.0.0', { background: true, cwd: '/home/user/who' })
    addresses.push((await server.commands.run('hostname -I')).stdout.split(/\s+/)[0])
  }
  for (const [index, server] of servers.entries()) {
    await until(`the web server at ${addresses[index]}`, async () =>
      (await server.commands.run('curl -s localhost:8080/who || true')).stdout,
    )
  }
  return addresses
}

// The call's result, or null when it threw (retried by `until`, or best-effort cleanup).
async function attempt(call) {
  try {
    return await call()
  } catch {
    return null
  }
}

async function main() {
  const report = {}
  const made = []
  const templateName = `tour-${randomUUID().replaceAll('-', '').slice(0, 8)}`
  try {
    const [denied, allowed] = await webServers(2, made)
    const sandbox = await Sandbox.create({ network: { denyOut: [denied], allowOut: [allowed] } })
    made.push(sandbox)

    // Network rules: the denied server is unreachable, the allowed one answers.
    report.network = {
      denied: await fetchInside(sandbox, `http://${denied}:8080/who`),
      allowed: await fetchInside(sandbox, `http://${allowed}:8080/who`),
    }

    // A PTY: type a command, read the terminal (output arrives through onData).
    let screen = ''
    const decoder = new TextDecoder()
    const terminal = await sandbox.pty.create({
      rows: 24,
      cols: 80,
      timeoutMs: 0,
      onData: (data) => (screen += decoder.decode(data, { stream: true })),
    })
    // Killing the PTY ends its handle with an error; nothing waits on it, so keep it from going unhandled.
    terminal.wait().catch(() => null)
    await sandbox.pty.sendInput(terminal.pid, new TextEncoder().encode('echo typed-$((6*7))\n'))
    await until("the PTY's answer", () => screen.includes('typed-42'))
    await sandbox.pty.kill(terminal.pid)
    report.pty = screen.includes('typed-42')

    // A directory watch (events arrive through a callback too).
    await sandbox.files.makeDir('/home/user/watched')
    const events = []
    const watch = await sandbox.files.watchDir('/home/user/watched', (event) => events.push([event.name, event.type]))
    await sandbox.files.write('/home/user/watched/note.txt', 'hello')
    await until("the watch's events", () => events.some(([name, type]) => name === 'note.txt' && type === 'write'))
    await watch.stop()
    // As tour.py's sorted(set(events)): distinct [name, type] pairs in order.
    report.watch = [...new Set(events.map((event) => JSON.stringify(event)))]
      .map((event) => JSON.parse(event))
      .sort(([a, x], [b, y]) => (a === b ? (x < y ? -1 : x > y ? 1 : 0) : a < b ? -1 : 1))

    // HTTP on port 3000, reached through getHost.
    await sandbox.files.write('/home/user/site/index.html', 'hello from port 3000')
    await sandbox.commands.run('python3 -m http.server 3000', { background: true, cwd: '/home/user/site' })
    const host = sandbox.getHost(3000)
    report.preview = await until('the preview host', () => attempt(() => fetchPreview(host, '/index.html')))

    // A template built from the local base image, and a sandbox from it.
    await Template.build(Template().fromTemplate('base').runCmd('echo built-by-tour > /home/user/tour.txt'), templateName)
    const templated = await Sandbox.create(templateName)
    made.push(templated)
    report.template = (await templated.files.read('/home/user/tour.txt')).trim()

    // Snapshot, a sandbox from the snapshot, and a fork.
    await sandbox.files.write('/home/user/state.txt', 'before the snapshot')
    const snapshot = await sandbox.createSnapshot()
    const restored = await Sandbox.create(snapshot.snapshotId)
    made.push(restored)
    const [fork] = await sandbox.fork({ count: 1 })
    if (fork instanceof Error) throw fork
    made.push(fork)
    await fork.files.write('/home/user/state.txt', 'changed in the fork')
    report.snapshot = await restored.files.read('/home/user/state.txt')
    report.fork = [await fork.files.read('/home/user/state.txt'), await sandbox.files.read('/home/user/state.txt')]
    await Sandbox.deleteSnapshot(snapshot.snapshotId)

    // Metrics: CPU, memory and disk samples.
    const metrics = await until('a metrics sample', async () => {
      const samples = await sandbox.getMetrics()
      return samples.length > 0 ? samples : null
    }, 30)
    report.metrics = { samples: metrics.length, memory_total: metrics[metrics.length - 1].memTotal > 0 }
  } finally {
    for (const sandbox of made) await attempt(() => sandbox.kill())
    // The SDK deletes a template (and a snapshot, which E2B keeps as one) with DELETE /templates/{id}.
    await attempt(() => Sandbox.deleteSnapshot(templateName))
  }
  return report
}

console.log(JSON.stringify(await main()))
