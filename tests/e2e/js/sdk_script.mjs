// The unmodified E2B JavaScript SDK against Corral: what tests/e2e/test_e2b_sdk.py, test_e2b_pty.py and
// test_e2b_watch.py do with the Python SDK, as a TypeScript user's program would do it. Only E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY are set (tests/e2e/test_e2b_js_sdk.py runs it); `node sdk_script.mjs` prints one
// JSON summary line, which the test checks. Any exception ends the script with a nonzero exit and its stack.
import { CommandExitError, NotFoundError, Sandbox } from 'e2b'

const summary = {}
const decoder = new TextDecoder()

// Poll `check` until it returns a truthy value, or throw once `seconds` pass (no fixed sleeps).
async function until(what, check, seconds = 60) {
  const deadline = Date.now() + seconds * 1000
  for (;;) {
    const value = await check()
    if (value) return value
    if (Date.now() > deadline) throw new Error(`${what}: not seen within ${seconds} s`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

async function commands(sandbox) {
  const out = []
  const run = await sandbox.commands.run('echo "$GREETING $MARK"; echo oops >&2; pwd; whoami', {
    envs: { MARK: 'm-1' },
    onStdout: (data) => out.push(data),
  })
  const inTmp = await sandbox.commands.run('pwd', { cwd: '/tmp' })
  const root = await sandbox.commands.run('whoami; echo $HOME', { user: 'root' })
  let failure = null
  try {
    await sandbox.commands.run('echo partial; exit 3')
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error
    failure = { exitCode: error.exitCode, stdout: error.stdout, class: error.constructor.name }
  }
  const background = await sandbox.commands.run('sleep 600', { background: true })
  const listed = (await sandbox.commands.list()).some((p) => p.pid === background.pid)
  const killed = await sandbox.commands.kill(background.pid)
  let backgroundExit
  try {
    backgroundExit = (await background.wait()).exitCode
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error
    backgroundExit = error.exitCode
  }
  const cat = await sandbox.commands.run('cat', { background: true, stdin: true })
  await sandbox.commands.sendStdin(cat.pid, 'typed into stdin\n')
  const joined = await sandbox.commands.connect(cat.pid)
  await sandbox.commands.closeStdin(cat.pid)
  const catResult = await cat.wait()
  const joinedResult = await joined.wait()
  summary.commands = {
    stdin: { stdout: catResult.stdout, exitCode: catResult.exitCode, joinedExit: joinedResult.exitCode },
    stdout: run.stdout,
    stderr: run.stderr,
    exitCode: run.exitCode,
    streamed: out.join(''),
    cwd: inTmp.stdout.trim(),
    root: root.stdout.trim().split('\n'),
    failure,
    background: { listed, killed, exitCode: backgroundExit, killAgain: await sandbox.commands.kill(background.pid) },
  }
}

async function files(sandbox) {
  const written = await sandbox.files.write('~/notes/hello.txt', 'hello from js')
  const text = await sandbox.files.read('/home/user/notes/hello.txt')
  const bytes = await sandbox.files.read('notes/hello.txt', { format: 'bytes' })
  const info = await sandbox.files.getInfo('~/notes/hello.txt')
  const made = await sandbox.files.makeDir('/home/user/notes/sub/deeper')
  const madeAgain = await sandbox.files.makeDir('/home/user/notes/sub/deeper')
  await sandbox.files.write([
    { path: '/home/user/notes/a.txt', data: 'a' },
    { path: '/home/user/notes/b.bin', data: new Uint8Array([0, 1, 2, 255]).buffer },
  ])
  const listing = (await sandbox.files.list('/home/user/notes')).map((e) => `${e.name}:${e.type}`).sort()
  const deep = (await sandbox.files.list('/home/user/notes', { depth: 3 })).map((e) => e.path).sort()
  const exists = await sandbox.files.exists('/home/user/notes/a.txt')
  await sandbox.files.remove('/home/user/notes/a.txt')
  const existsAfter = await sandbox.files.exists('/home/user/notes/a.txt')
  let missing = 'no error'
  try {
    await sandbox.files.read('/home/user/notes/a.txt')
  } catch (error) {
    missing = error.constructor.name
  }
  const zipped = await sandbox.files.write('/home/user/notes/z.txt', 'z'.repeat(5000), {
    gzip: true,
    metadata: { origin: 'js' },
  })
  const unzipped = await sandbox.files.read('/home/user/notes/z.txt', { gzip: true })
  const tagged = await sandbox.files.getInfo('/home/user/notes/z.txt')
  await sandbox.commands.run('ln -s /home/user/notes/z.txt /home/user/notes/link')
  const link = await sandbox.files.getInfo('/home/user/notes/link')
  const downloadUrl = await sandbox.downloadUrl('/home/user/notes/hello.txt')
  const downloaded = await fetch(downloadUrl).then((r) => r.text())
  const renamed = await sandbox.files.rename('/home/user/notes/b.bin', '/home/user/notes/c.bin')
  const binary = Array.from(await sandbox.files.read('/home/user/notes/c.bin', { format: 'bytes' }))
  summary.files = {
    written: { name: written.name, path: written.path, type: written.type },
    text,
    bytes: decoder.decode(bytes),
    info: {
      name: info.name,
      type: info.type,
      path: info.path,
      size: info.size,
      owner: info.owner,
      group: info.group,
      permissions: info.permissions,
      modified: info.modifiedTime instanceof Date,
    },
    made,
    madeAgain,
    listing,
    deep,
    exists,
    existsAfter,
    missing,
    gzip: { written: zipped.metadata, length: unzipped.length, metadata: tagged.metadata },
    symlink: { type: link.type, target: link.symlinkTarget },
    downloaded,
    renamed: renamed.path,
    binary,
  }
}

async function pty(sandbox) {
  let output = ''
  const terminal = await sandbox.pty.create({
    rows: 30,
    cols: 100,
    cwd: '/tmp',
    envs: { MARK: 'p-1' },
    timeoutMs: 0,
    onData: (data) => {
      output += decoder.decode(data)
    },
  })
  const encoder = new TextEncoder()
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('echo hi-$((40+2)) $MARK $TERM; pwd; stty size\n'))
  await until('pty output', () => output.includes('hi-42 p-1 xterm-256color') && output.includes('30 100'))
  await sandbox.pty.resize(terminal.pid, { rows: 51, cols: 133 })
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('stty size\n'))
  await until('pty resize', () => output.includes('51 133'))
  let joined = ''
  const listener = await sandbox.pty.connect(terminal.pid, {
    timeoutMs: 0,
    onData: (data) => {
      joined += decoder.decode(data)
    },
  })
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('echo again-$((1+1))\n'))
  await until('pty connect', () => joined.includes('again-2'))
  await sandbox.pty.sendInput(terminal.pid, encoder.encode('exit 3\n'))
  let exitCode
  try {
    exitCode = (await terminal.wait()).exitCode
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error
    exitCode = error.exitCode
  }
  let joinedExit
  try {
    joinedExit = (await listener.wait()).exitCode
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error
    joinedExit = error.exitCode
  }
  const doomed = await sandbox.pty.create({ rows: 24, cols: 80, timeoutMs: 0, onData: () => {} })
  const kill = await sandbox.pty.kill(doomed.pid)
  let killedExit
  try {
    killedExit = (await doomed.wait()).exitCode
  } catch (error) {
    if (!(error instanceof CommandExitError)) throw error
    killedExit = error.exitCode
  }
  summary.pty = {
    pwd: output.includes('\n/tmp\r'),
    exitCode,
    joinedExit,
    kill,
    killedExit,
    killAgain: await sandbox.pty.kill(doomed.pid),
  }
}

async function watch(sandbox) {
  await sandbox.files.makeDir('/home/user/w')
  const seen = []
  const exits = []
  const handle = await sandbox.files.watchDir('/home/user/w', (event) => seen.push([event.name, event.type]), {
    recursive: true,
    onExit: (error) => exits.push(error === undefined ? 'none' : String(error)),
  })
  await sandbox.commands.run(
    'cd /home/user/w && echo hi > a.txt && chmod 600 a.txt && mv a.txt b.txt && rm b.txt' +
      ' && mkdir sub && echo x > sub/f.txt',
  )
  await until('watch events', () => seen.some(([name, type]) => name === 'sub/f.txt' && type === 'create'))
  await handle.stop()
  let missing = 'no error'
  try {
    await sandbox.files.watchDir('/home/user/missing', () => {})
  } catch (error) {
    missing = error instanceof NotFoundError ? 'NotFoundError' : `${error.constructor.name}: ${error.message}`
  }
  summary.watch = { seen, missing }
}

async function host(sandbox) {
  await sandbox.files.write('/tmp/site/hello.txt', 'hello from port 3000')
  await sandbox.commands.run('python3 -m http.server 3000 --bind 0.0.0.0', { background: true, cwd: '/tmp/site' })
  const name = sandbox.getHost(3000)
  // There is no DNS for the preview domain here: send to the server's own address with the preview host in Host,
  // as a wildcard DNS name would. Node's fetch refuses a Host header, so use http.request.
  const { request } = await import('node:http')
  const server = new URL(process.env.E2B_API_URL)
  const get = () =>
    new Promise((resolve) => {
      const req = request(
        { host: server.hostname, port: server.port, path: '/hello.txt', headers: { Host: name } },
        (res) => {
          let body = ''
          res.on('data', (chunk) => (body += chunk))
          res.on('end', () => resolve(res.statusCode === 200 ? body : null))
        },
      )
      req.on('error', () => resolve(null))
      req.end()
    })
  summary.host = { name, body: await until('the server on port 3000', get) }
}

async function lifecycle(sandbox) {
  const info = await sandbox.getInfo()
  await sandbox.setTimeout(600_000)
  const extended = await sandbox.getInfo()
  const timeoutLeft = Math.round((extended.endAt.getTime() - Date.now()) / 1000)
  const listed = []
  const paginator = Sandbox.list()
  while (paginator.hasNext) listed.push(...(await paginator.nextItems()).map((s) => s.sandboxId))
  const metrics = await until('metrics', async () => {
    const samples = await sandbox.getMetrics()
    return samples.length > 0 ? samples : null
  })
  const sample = metrics[metrics.length - 1]
  const again = await Sandbox.connect(sandbox.sandboxId)
  const viaConnect = (await again.commands.run('echo connected')).stdout.trim()
  summary.lifecycle = {
    info: { sandboxId: info.sandboxId, templateId: info.templateId, metadata: info.metadata, state: info.state },
    listed: listed.includes(sandbox.sandboxId),
    running: await sandbox.isRunning(),
    timeoutSet: timeoutLeft > 590 && timeoutLeft <= 600,
    viaConnect,
    metrics: {
      count: metrics.length,
      cpuCount: sample.cpuCount,
      memTotal: sample.memTotal > 0,
      diskTotal: sample.diskTotal > 0,
      timestamp: sample.timestamp instanceof Date,
    },
  }
}

async function snapshots(sandbox) {
  await sandbox.files.write('/home/user/state.txt', 'before the snapshot')
  const snapshot = await sandbox.createSnapshot()
  const ofSandbox = []
  const snapshotPages = sandbox.listSnapshots()
  while (snapshotPages.hasNext) ofSandbox.push(...(await snapshotPages.nextItems()).map((s) => s.snapshotId))
  const restored = await Sandbox.create(snapshot.snapshotId)
  try {
    summary.snapshot = {
      id: typeof snapshot.snapshotId === 'string' && snapshot.snapshotId.length > 0,
      restored: await restored.files.read('/home/user/state.txt'),
      original: await sandbox.commands.run('echo alive').then((r) => r.stdout.trim()),
      listed: ofSandbox.includes(snapshot.snapshotId),
    }
  } finally {
    await restored.kill()
  }
  summary.snapshot.deleted = await Sandbox.deleteSnapshot(snapshot.snapshotId)
  summary.snapshot.deletedAgain = await Sandbox.deleteSnapshot(snapshot.snapshotId)
}

async function pause(sandbox) {
  // A counting daemon: pause keeps memory, so after connect (which resumes) it counts on from where it was. It is
  // started with setsid, as the README says: commands the SDK tracks end at a pause on Corral.
  await sandbox.commands.run(
    "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/n.new; mv /tmp/n.new /tmp/n; sleep 0.05; done'" +
      ' >/dev/null 2>&1 </dev/null & while [ ! -s /tmp/n ]; do sleep 0.01; done',
  )
  const count = async () => Number((await sandbox.commands.run('cat /tmp/n')).stdout.trim())
  const before = await count()
  const paused = await sandbox.pause()
  const info = await Sandbox.getInfo(sandbox.sandboxId)
  let whilePaused = 'no error'
  try {
    await sandbox.commands.run('true')
  } catch (error) {
    whilePaused = error.constructor.name
  }
  const resumed = await Sandbox.connect(sandbox.sandboxId)
  const first = await count()
  await until('the counter after resume', async () => (await count()) > first)
  summary.pause = {
    paused,
    state: info.state,
    whilePaused,
    countsOn: first >= before,
    stateAfter: (await resumed.getInfo()).state,
  }
}

async function fork(sandbox) {
  await sandbox.files.write('/home/user/fork.txt', 'from the parent')
  const forks = await Sandbox.fork(sandbox.sandboxId, { count: 2 })
  try {
    summary.fork = {
      count: forks.length,
      errors: forks.filter((f) => f instanceof Error).map((f) => f.message),
      read: await Promise.all(
        forks.filter((f) => f instanceof Sandbox).map((f) => f.files.read('/home/user/fork.txt')),
      ),
      distinct: new Set(forks.map((f) => f.sandboxId)).size,
    }
  } finally {
    await Promise.all(forks.filter((f) => f instanceof Sandbox).map((f) => f.kill()))
  }
}

const sandbox = await Sandbox.create({ metadata: { team: 'corral' }, envs: { GREETING: 'hello' } })
try {
  summary.sandboxId = sandbox.sandboxId
  await commands(sandbox)
  await files(sandbox)
  await pty(sandbox)
  await watch(sandbox)
  await host(sandbox)
  await lifecycle(sandbox)
  // gVisor cannot checkpoint a sandbox on the network (README's gVisor notes): snapshots and forks use an isolated one.
  const isolated = await Sandbox.create({ allowInternetAccess: false })
  try {
    await snapshots(isolated)
    await fork(isolated)
    await pause(isolated)
  } finally {
    await isolated.kill()
  }
} catch (error) {
  console.error(`failed after ${JSON.stringify(summary)}`)
  throw error
} finally {
  summary.kill = await sandbox.kill()
}
summary.killAgain = await Sandbox.kill(sandbox.sandboxId)
summary.runningAfterKill = await sandbox.isRunning()
console.log(JSON.stringify(summary))
