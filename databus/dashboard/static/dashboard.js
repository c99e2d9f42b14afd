// databus dashboard: polls /v1/dashboard (the `databus status --json` document and the
// history of a few figures) and draws the panels. Hand-written, no framework, no build.
//
// Every value shown is an element with data-field (its path in the document, e.g.
// "relays.0.buffers.1.fetcher.lag_seconds"; "." and "%" in a key as %2E and %25) and data-value (the JSON value), so a test
// can compare the page with the document. Text is set with textContent only: nothing
// the services answer is ever parsed as HTML.
"use strict";

(function () {
  const MIN_GAP_MS = 200; // between two polls (the server paces them with ?after=)
  const RETRY_MS = 1000;
  const state = { doc: null, series: new Map(), windowS: 600, since: 0, generated: null };

  // -- building elements --------------------------------------------------------------

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (name === "class") el.className = value;
      else if (name === "testid") el.setAttribute("data-testid", value);
      else el.setAttribute(name, value === true ? "" : String(value));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  // A key that holds "." or "%" (a source name: "shop.orders") is written with
  // %2E and %25, so that the path splits back at every ".".
  function pathOf(path) {
    return path.map((p) => String(p).replace(/%/g, "%25").replace(/\./g, "%2E")).join(".");
  }

  // One value of the document: its path, its JSON value, and how it reads.
  function val(path, value, text, cls) {
    return h("span", {
      class: cls, "data-field": pathOf(path),
      "data-value": JSON.stringify(value === undefined ? null : value),
    }, text === undefined ? fmtRaw(value) : text);
  }

  function table(testid, columns, rows, empty) {
    if (!rows.length) return empty ? h("p", { class: "empty", testid: testid + "-empty" }, empty) : null;
    return h("table", { testid },
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
      h("tbody", {}, rows));
  }

  function row(testid, key, cells, cls) {
    return h("tr", { testid, "data-key": key, class: cls }, cells.map((c) => h("td", {}, c)));
  }

  // -- formatting ---------------------------------------------------------------------

  function fmtRaw(v) {
    if (v === null || v === undefined) return "null";
    if (Array.isArray(v)) return v.length ? JSON.stringify(v) : "[]";
    if (typeof v === "object") return Object.keys(v).length ? JSON.stringify(v) : "{}";
    return String(v);
  }

  function isNum(v) { return typeof v === "number" && isFinite(v); }

  function fmtCount(n) {
    return isNum(n) ? n.toLocaleString("en-US", { maximumFractionDigits: 1 }) : "–";
  }

  function fmtLag(s) {
    if (!isNum(s)) return "unknown";
    return s < 100 ? s.toFixed(1) + " s" : Math.round(s).toLocaleString("en-US") + " s";
  }

  function fmtBytes(n) {
    if (!isNum(n)) return "–";
    const units = ["B", "KiB", "MiB", "GiB"];
    let i = 0;
    while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return i === 0 ? n.toFixed(0) + " B" : n.toFixed(1) + " " + units[i];
  }

  function fmtAgo(s) {
    if (!isNum(s)) return "–";
    if (s < 60) return s.toFixed(0) + " s ago";
    if (s < 3600) return (s / 60).toFixed(0) + " min ago";
    return (s / 3600).toFixed(1) + " h ago";
  }

  function fmtDuration(s) {
    if (!isNum(s)) return "–";
    if (s < 60) return Math.ceil(s) + " s";
    if (s < 3600) return Math.floor(s / 60) + " min " + Math.round(s % 60) + " s";
    return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " min";
  }

  function fmtPercent(f) { return isNum(f) ? (f * 100).toFixed(1) + " %" : "–"; }

  function stateClass(s) {
    if (s === null || s === undefined) return "muted";
    return ["running", "caught_up", "up", "ready", "held", "leader", "holder", "applying",
            "standby", "follower", "done", "idle"].includes(s) ? "good" : "bad";
  }

  // -- sparklines ---------------------------------------------------------------------

  function seriesKey(...parts) { return JSON.stringify(parts.map((p) => String(p))); }

  function spark(key) {
    const points = state.series.get(key) || [];
    const W = 120, H = 24, P = 2;
    const svgNS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(svgNS, "svg");
    svg.setAttribute("class", "spark");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    svg.setAttribute("width", W);
    svg.setAttribute("height", H);
    svg.setAttribute("data-testid", "spark");
    svg.setAttribute("data-series", key);
    svg.setAttribute("data-points", points.length);
    const now = isNum(state.doc && state.doc.generated_at) ? state.doc.generated_at : Date.now() / 1000;
    const known = points.filter((p) => isNum(p[1]));
    if (!known.length) return svg;
    let lo = Math.min(...known.map((p) => p[1])), hi = Math.max(...known.map((p) => p[1]));
    if (hi === lo) { hi += 1; lo = Math.max(0, lo - 1); }
    // The last minutes there are (at least one), up to the history's window.
    const span = Math.max(60, Math.min(state.windowS, now - points[0][0]));
    const x = (t) => P + (W - 2 * P) * (1 - Math.min(1, Math.max(0, (now - t) / span)));
    const y = (v) => H - P - (H - 2 * P) * (v - lo) / (hi - lo);
    let run = [];
    const flush = () => {
      if (run.length) {
        const line = document.createElementNS(svgNS, "polyline");
        line.setAttribute("points", (run.length === 1 ? [run[0], run[0]] : run).join(" "));
        svg.append(line);
      }
      run = [];
    };
    for (const [t, v] of points) {
      if (isNum(v)) run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
      else flush(); // unknown then: a gap, never a zero
    }
    flush();
    const title = document.createElementNS(svgNS, "title");
    title.textContent = `last ${Math.round(span / 60)} min: ${fmtCount(lo)} to ${fmtCount(hi)}`;
    svg.append(title);
    return svg;
  }

  function mergeHistory(history) {
    if (!history) return;
    if (isNum(history.window_s)) state.windowS = history.window_s;
    for (const [key, points] of Object.entries(history.series || {})) {
      const mine = state.series.get(key) || [];
      const last = mine.length ? mine[mine.length - 1][0] : -Infinity;
      for (const p of points) {
        if (p[0] > last) mine.push(p);
        if (p[0] > state.since) state.since = p[0];
      }
      state.series.set(key, mine);
    }
    const floor = (state.doc ? state.doc.generated_at : Date.now() / 1000) - state.windowS;
    for (const [key, mine] of state.series) {
      while (mine.length && mine[0][0] < floor) mine.shift();
      if (!mine.length) state.series.delete(key);
    }
  }

  // -- panels -------------------------------------------------------------------------

  const KINDS = [["relay", "relays"], ["bootstrap", "bootstraps"], ["replicator", "replicators"]];

  function readiness(doc) {
    const services = [], down = [], quarantined = [];
    for (const [kind, key] of KINDS) {
      (doc[key] || []).forEach((e, i) => {
        const p = [key, i];
        const st = "error" in e ? "DOWN" : e.ready ? "ready" : "NOT READY";
        services.push(row("service", `${kind} ${e.url}`, [kind, val([...p, "url"], e.url),
          h("span", { class: stateClass(st === "ready" ? "ready" : "bad"), testid: "service-state" }, st),
          "error" in e ? val([...p, "error"], e.error) : val([...p, "ready"], e.ready, e.ready ? "ready" : "not ready")]));
        (e.not_ready || []).forEach((c, j) => {
          const q = [...p, "not_ready", j];
          const where = c.buffer ?? c.source ?? c.index;
          down.push(row("not-ready", `${e.url} ${c.component} ${where ?? ""}`, [
            kind, val([...p, "url"], e.url),
            h("span", {}, val([...q, "component"], c.component),
              where === undefined || where === null ? "" : " ",
              where === undefined || where === null ? "" :
                val([...q, c.buffer != null ? "buffer" : c.source != null ? "source" : "index"], where)),
            val([...q, "state"], c.state, undefined, "bad"), val([...q, "error"], c.error ?? null),
            val([...q, "message"], c.message ?? null), val([...q, "fix"], c.fix ?? null, undefined, "fix")]));
        });
        if (kind === "relay") (e.buffers || []).forEach((b, j) => (b.quarantined || []).forEach((s, k) => {
          const q = [...p, "buffers", j, "quarantined", k];
          quarantined.push(row("quarantined", `${e.url} ${b.name} ${s.source}`, [
            val([...p, "url"], e.url), val([...p, "buffers", j, "name"], b.name),
            val([...q, "source"], s.source), val([...q, "state"], s.state, "QUARANTINED", "bad"),
            val([...q, "scn"], s.scn, fmtCount(s.scn)), val([...q, "age_s"], s.age_s, fmtAgo(s.age_s)),
            val([...q, "reason"], s.reason), val([...q, "fix"], s.fix, undefined, "fix")]));
        }));
      });
    }
    return [
      table("services", ["kind", "url", "state", "detail"], services, "no service named"),
      down.length ? h("h3", {}, "Not ready") : null,
      table("not-ready-table", ["service", "url", "component", "state", "error", "message", "fix"], down),
      quarantined.length ? h("h3", {}, "Quarantined sources") : null,
      table("quarantined-table", ["relay", "buffer", "source", "state", "SCN", "since", "reason", "fix"], quarantined),
    ];
  }

  function topology(doc) {
    const out = [];
    const c = doc.clusters;
    if (c === undefined || c === null) {
      out.push(h("p", { class: "empty", testid: "no-zookeeper" },
        "Started without --zookeeper: the clusters and consumer groups are not shown."));
    } else if ("error" in c) {
      out.push(h("p", { class: "bad", testid: "zookeeper-error" }, "ZooKeeper ",
        val(["clusters", "zookeeper"], c.zookeeper), ": ", val(["clusters", "error"], c.error)));
    } else {
      out.push(h("p", { class: "muted wide" }, "ZooKeeper ", val(["clusters", "zookeeper"], c.zookeeper)));
      (c.clusters || []).forEach((rc, i) => {
        const p = ["clusters", "clusters", i];
        const members = rc.members.map((m, j) => row("cluster-member", m.url, [
          val([...p, "members", j, "url"], m.url), val([...p, "members", j, "mode"], m.mode),
          val([...p, "members", j, "age_s"], m.age_s, fmtAgo(m.age_s))]));
        const buffers = rc.buffers.map((b, j) => {
          const q = [...p, "buffers", j];
          return h("div", { class: "cluster-buffer", testid: "cluster-buffer", "data-key": b.name },
            h("p", {}, "buffer ", val([...q, "name"], b.name, undefined, "name"), ": ",
              b.leader_follower ? ["leader ", val([...q, "leader"], b.leader, b.leader || "NONE",
                b.leader ? "good" : "bad")] : val([...q, "leader_follower"], false, "independent members"),
              ", epoch ", val([...q, "epoch"], b.epoch, fmtCount(b.epoch)),
              b.waiting.length ? [", waiting ", val([...q, "waiting"], b.waiting, b.waiting.join(", "))] :
                val([...q, "waiting"], b.waiting, "")),
            table("cluster-roles", ["member", "role", "epoch", "max SCN"], b.members.map((r, k) =>
              row("cluster-role", r.url, [val([...q, "members", k, "url"], r.url),
                val([...q, "members", k, "role"], r.role, undefined, stateClass(r.role)),
                val([...q, "members", k, "epoch"], r.epoch, fmtCount(r.epoch)),
                val([...q, "members", k, "max_scn"], r.max_scn, fmtCount(r.max_scn))]))));
        });
        out.push(h("div", { class: "card", testid: "relay-cluster", "data-key": rc.name },
          h("h3", {}, "relay cluster ", val([...p, "name"], rc.name), " (", val([...p, "mode"], rc.mode), ")"),
          table("cluster-members", ["member", "mode", "updated"], members, "no members"),
          buffers, rc.problems.map((pr, k) => h("p", { class: "bad", testid: "problem" },
            val([...p, "problems", k], pr)))));
      });
      (c.bootstrap || []).forEach((bc, i) => {
        const p = ["clusters", "bootstrap", i];
        out.push(h("div", { class: "card", testid: "bootstrap-cluster", "data-key": bc.name },
          h("h3", {}, "bootstrap cluster ", val([...p, "name"], bc.name)),
          table("bootstrap-members", ["member", "runs", "updated"], bc.members.map((m, j) =>
            row("bootstrap-member", m.url, [val([...p, "members", j, "url"], m.url ?? null),
              val([...p, "members", j, "runs"], m.runs ?? null, runsText(m.runs)),
              val([...p, "members", j, "age_s"], m.age_s, fmtAgo(m.age_s))])), "no members"),
          table("bootstrap-locks", ["store", "runs", "held by", "standby"], bc.locks.map((lk, j) =>
            row("bootstrap-lock", lk.lock, [val([...p, "locks", j, "store"], lk.store, lk.store ?? lk.lock),
              val([...p, "locks", j, "component"], lk.component, lk.component ?? "lock"),
              val([...p, "locks", j, "holder"], lk.holder, lk.holder || "NONE", lk.holder ? "good" : "bad"),
              val([...p, "locks", j, "waiting"], lk.waiting, lk.waiting.join(", ") || "–")])))));
      });
      if (!(c.clusters || []).length && !(c.bootstrap || []).length) {
        out.push(h("p", { class: "empty" }, "no relay or bootstrap cluster registered"));
      }
    }
    const repl = (doc.replicators || []).map((r, i) => row("topology-replicator", r.url, [
      val(["replicators", i, "url"], r.url),
      "error" in r ? val(["replicators", i, "error"], r.error, "DOWN", "bad") :
        [val(["replicators", i, "replication"], r.replication), " ",
          val(["replicators", i, "state"], r.state, undefined, stateClass(r.state))]]));
    if (repl.length) {
      out.push(h("div", { class: "card" }, h("h3", {}, "Replicators"),
        table("topology-replicators", ["url", "replication"], repl)));
    }
    const groups = (doc.groups || []).map((g, i) => row("topology-group", g.group, [
      val(["groups", i, "group"], g.group),
      "error" in g ? val(["groups", i, "error"], g.error, undefined, "bad") :
        [val(["groups", i, "members"], g.members, `${g.members.length} member(s)`), ", leader ",
          val(["groups", i, "leader"], g.leader, g.leader || "NONE")]]));
    if (groups.length) {
      out.push(h("div", { class: "card" }, h("h3", {}, "Consumer groups"),
        table("topology-groups", ["group", ""], groups)));
    }
    return out;
  }

  function runsText(runs) {
    if (!runs || typeof runs !== "object") return "–";
    const parts = Object.keys(runs).sort().filter((k) => Array.isArray(runs[k]) && runs[k].length)
      .map((k) => `${k} (${runs[k].length} source${runs[k].length === 1 ? "" : "s"})`);
    return parts.join(", ") || "standby";
  }

  function buffers(doc) {
    const rows = [];
    (doc.relays || []).forEach((r, i) => (r.buffers || []).forEach((b, j) => {
      const p = ["relays", i, "buffers", j], f = b.fetcher, fp = [...p, "fetcher"];
      rows.push(row("buffer", `${r.url} ${b.name}`, [
        val(["relays", i, "url"], r.url), val([...p, "name"], b.name, undefined, "name"),
        h("span", {}, val([...p, "min_scn"], b.min_scn, fmtCount(b.min_scn)), " .. ",
          val([...p, "max_scn"], b.max_scn, fmtCount(b.max_scn))),
        val([...p, "fill"], b.fill, fmtPercent(b.fill)),
        h("span", { class: "figure" }, val([...p, "input_bytes_per_second"], b.input_bytes_per_second,
          fmtBytes(b.input_bytes_per_second) + "/s"), spark(seriesKey("buffer", r.url, b.name, "input_bytes_per_second"))),
        f ? val([...fp, "state"], f.state, undefined, stateClass(f.state)) : val(fp, null, "none"),
        f ? h("span", { class: "figure" }, val([...fp, "lag_seconds"], f.lag_seconds, fmtLag(f.lag_seconds)),
          spark(seriesKey("buffer", r.url, b.name, "lag_seconds"))) : "",
        f ? val([...fp, "last_window_age_s"], f.last_window_age_s, fmtAgo(f.last_window_age_s)) : "",
        f ? val([...fp, "restarts"], f.restarts, fmtCount(f.restarts)) : "",
        f ? val([...fp, "last_error"], f.last_error, f.last_error || "", "bad") : "",
      ], (b.quarantined || []).length ? "alert" : undefined));
    }));
    return table("buffers-table", ["relay", "buffer", "SCN min .. max", "fill", "input", "fetcher",
      "lag", "last window", "restarts", "last error"], rows, "no buffer (no relay answered)");
  }

  function consumers(doc) {
    const rows = [];
    (doc.relays || []).forEach((r, i) => {
      if ("error" in r) return;
      if (r.consumers === null) {
        rows.push(row("consumers-missing", r.url, [val(["relays", i, "url"], r.url),
          val(["relays", i, "consumers_error"], r.consumers_error), "", "", "", "", "", "", ""]));
        return;
      }
      r.consumers.forEach((c, j) => {
        const p = ["relays", i, "consumers", j];
        rows.push(row("consumer", `${r.url} ${c.client_id} ${c.buffer}`, [
          val(["relays", i, "url"], r.url), val([...p, "client_id"], c.client_id, undefined, "name"),
          val([...p, "buffer"], c.buffer, c.buffer ?? "–"),
          val([...p, "checkpoint_scn"], c.checkpoint_scn, fmtCount(c.checkpoint_scn)),
          h("span", { class: "figure" }, val([...p, "lag_seconds"], c.lag_seconds, fmtLag(c.lag_seconds)),
            spark(seriesKey("consumer", r.url, c.client_id, c.buffer, "lag_seconds"))),
          val([...p, "lag_scn"], c.lag_scn, fmtCount(c.lag_scn)),
          h("span", { class: "figure" }, val([...p, "events_per_second"], c.events_per_second,
            fmtCount(c.events_per_second)), spark(seriesKey("consumer", r.url, c.client_id, c.buffer, "events_per_second"))),
          val([...p, "streaming"], c.streaming, c.streaming ? "stream" : "poll"),
          val([...p, "idle_s"], c.idle_s, fmtAgo(c.idle_s))]));
      });
    });
    return table("consumers-table", ["relay", "client id", "buffer", "SCN", "lag", "lag SCN",
      "events/s", "mode", "last seen"], rows, "no consumer seen");
  }

  function groups(doc) {
    if (doc.groups === undefined || doc.groups === null) {
      return h("p", { class: "empty" }, "Started without --zookeeper.");
    }
    if (!doc.groups.length) return h("p", { class: "empty", testid: "no-groups" }, "no consumer group");
    return doc.groups.map((g, i) => {
      const p = ["groups", i];
      if ("error" in g) {
        return h("div", { class: "card", testid: "group", "data-key": g.group }, h("h3", {}, "group ",
          val([...p, "group"], g.group)), h("p", { class: "bad" }, val([...p, "error"], g.error)));
      }
      return h("div", { class: "card", testid: "group", "data-key": g.group },
        h("h3", {}, "group ", val([...p, "group"], g.group), ": generation ",
          val([...p, "generation"], g.generation, fmtCount(g.generation)), ", ",
          val([...p, "partition_count"], g.partition_count, fmtCount(g.partition_count)), " partitions, leader ",
          val([...p, "leader"], g.leader, g.leader || "NONE")),
        table("group-members", ["member", "client id", "assigned", "held", "consumer SCN", "lag"],
          g.members.map((m, j) => row("group-member", m.member ?? m.node, [
            val([...p, "members", j, "member"], m.member), val([...p, "members", j, "client_id"], m.client_id),
            val([...p, "members", j, "assigned"], m.assigned, ranges(m.assigned)),
            val([...p, "members", j, "held"], m.held, ranges(m.held)),
            val([...p, "members", j, "consumer_scn"], m.consumer_scn, fmtCount(m.consumer_scn)),
            h("span", { class: "figure" }, val([...p, "members", j, "lag_seconds"], m.lag_seconds, fmtLag(m.lag_seconds)),
              spark(seriesKey("group", g.group, m.member, "lag_seconds")))])), "no members"),
        table("group-partitions", ["partition", "holder", "state", "checkpoint SCN", "lag SCN"],
          g.partitions.map((r, j) => row("group-partition", String(r.partition), [
            val([...p, "partitions", j, "partition"], r.partition),
            val([...p, "partitions", j, "holder"], r.holder, r.holder ?? "–"),
            val([...p, "partitions", j, "state"], r.state, undefined, stateClass(r.state)),
            val([...p, "partitions", j, "checkpoint_scn"], r.checkpoint_scn, fmtCount(r.checkpoint_scn)),
            val([...p, "partitions", j, "lag_scn"], r.lag_scn, fmtCount(r.lag_scn))]))),
        g.problems.map((pr, k) => h("p", { class: "bad", testid: "problem" }, val([...p, "problems", k], pr))),
        g.warnings.map((w, k) => h("p", { class: "muted" }, val([...p, "warnings", k], w))));
    });
  }

  function ranges(parts) {
    if (!Array.isArray(parts)) return "–";
    const out = [];
    let run = [];
    for (const p of [...new Set(parts)].sort((a, b) => a - b)) {
      if (run.length && p === run[run.length - 1] + 1) { run.push(p); continue; }
      if (run.length) out.push(run.length === 1 ? `${run[0]}` : `${run[0]}-${run[run.length - 1]}`);
      run = [p];
    }
    if (run.length) out.push(run.length === 1 ? `${run[0]}` : `${run[0]}-${run[run.length - 1]}`);
    return out.join(",") || "none";
  }

  function dumps(doc) {
    const rows = [];
    (doc.relays || []).forEach((r, i) => (r.buffers || []).forEach((b, j) => (b.dumps || []).forEach((d, k) => {
      const p = ["relays", i, "buffers", j, "dumps", k];
      const left = isNum(d.estimate) && isNum(d.rows) ? Math.max(0, d.estimate - d.rows) : null;
      const eta = left !== null && isNum(d.rows_per_second) && d.rows_per_second > 0 ? left / d.rows_per_second : null;
      const pct = isNum(d.percent) ? Math.min(100, Math.max(0, d.percent)) : 0;
      rows.push(row("dump", d.id, [val(["relays", i, "url"], r.url), val(["relays", i, "buffers", j, "name"], b.name),
        val([...p, "id"], d.id), val([...p, "state"], d.state, undefined, stateClass(d.state)),
        h("span", { class: "progress" }, h("progress", { max: 100, value: pct.toFixed(1) }), " ",
          val([...p, "percent"], d.percent, isNum(d.percent) ? d.percent.toFixed(1) + " %" : "–")),
        h("span", {}, val([...p, "rows"], d.rows, fmtCount(d.rows)), " / ", val([...p, "estimate"], d.estimate, fmtCount(d.estimate))),
        val([...p, "rows_per_second"], d.rows_per_second, fmtCount(d.rows_per_second)),
        h("span", { testid: "dump-eta" }, d.state === "running" ? fmtDuration(eta) : "–"),
        val([...p, "table"], d.table ?? null, d.table ?? "–"), val([...p, "reason"], d.reason ?? null, d.reason ?? "")]));
    })));
    return table("dumps-table", ["relay", "buffer", "dump", "state", "progress", "rows / estimate",
      "rows/s", "ETA", "table", "reason"], rows, "no dump");
  }

  function bootstraps(doc) {
    const rows = (doc.bootstraps || []).filter((b) => !("error" in b)).map((b) => {
      const i = doc.bootstraps.indexOf(b), p = ["bootstraps", i];
      return row("bootstrap", b.url, [val([...p, "url"], b.url),
        val([...p, "log_scn"], b.log_scn, fmtCount(b.log_scn)), val([...p, "applied_scn"], b.applied_scn, fmtCount(b.applied_scn)),
        h("span", { class: "figure" }, val([...p, "applier_lag_seconds"], b.applier_lag_seconds, fmtLag(b.applier_lag_seconds)),
          spark(seriesKey("bootstrap", b.url, "applier_lag_seconds"))),
        h("span", {}, val([...p, "log_windows"], b.log_windows, fmtCount(b.log_windows)), " windows, ",
          val([...p, "log_bytes"], b.log_bytes, fmtBytes(b.log_bytes))),
        val([...p, "snapshot_rows"], b.snapshot_rows, fmtCount(b.snapshot_rows)),
        h("span", {}, Object.entries(b.components || {}).map(([name, c]) => h("span", { class: "component" },
          name, " ", val([...p, "components", name, "state"], c.state, undefined, stateClass(c.state)),
          c.last_error ? [" ", val([...p, "components", name, "last_error"], c.last_error, undefined, "bad")] : "")))]);
    });
    return table("bootstraps-table", ["url", "log SCN", "applied SCN", "applier lag", "log",
      "snapshot rows", "components"], rows, "no bootstrap service answered");
  }

  function replicators(doc) {
    const rows = (doc.replicators || []).filter((r) => !("error" in r)).map((r) => {
      const i = doc.replicators.indexOf(r), p = ["replicators", i];
      return row("replicator", r.url, [val([...p, "url"], r.url), val([...p, "replication"], r.replication),
        val([...p, "state"], r.state, undefined, stateClass(r.state)),
        val([...p, "applied_scn"], r.applied_scn, fmtCount(r.applied_scn)), val([...p, "lag_scn"], r.lag_scn, fmtCount(r.lag_scn)),
        h("span", { class: "figure" }, val([...p, "lag_seconds"], r.lag_seconds, fmtLag(r.lag_seconds)),
          spark(seriesKey("replicator", r.url, "lag_seconds"))),
        val([...p, "batches"], r.batches, fmtCount(r.batches)), val([...p, "errors"], r.errors, fmtCount(r.errors)),
        val([...p, "last_error"], r.last_error, r.last_error || "", "bad")]);
    });
    return table("replicators-table", ["url", "replication", "state", "applied SCN", "lag SCN", "lag",
      "batches", "errors", "last error"], rows, "no replicator answered");
  }

  // Every leaf of the document (a scalar, or an empty array or object), by its path.
  function leaves(value, path, out) {
    if (value !== null && typeof value === "object") {
      const keys = Object.keys(value);
      if (keys.length) {
        for (const k of keys) leaves(value[k], [...path, k], out);
        return out;
      }
    }
    out.push([path, value]);
    return out;
  }

  function allValues(doc) {
    return table("values-table", ["field", "value"], leaves(doc, [], []).map(([path, value]) =>
      row("value", pathOf(path), [h("code", {}, pathOf(path)), val(path, value)])));
  }

  // -- the loop -----------------------------------------------------------------------

  function fill(id, content) {
    const body = document.querySelector(`#${id} .body`);
    body.replaceChildren(...[content].flat(Infinity).filter((n) => n instanceof Node));
  }

  function render(doc) {
    const verdict = document.getElementById("verdict");
    const problems = [];
    if (!doc.ok) problems.push(`${doc.down} service(s) down`);
    if (doc.not_ready) problems.push(`${doc.not_ready} component(s) not ready`);
    const zk = doc.clusters;
    if (zk && ("error" in zk || !zk.ok)) problems.push("a cluster problem");
    if ((doc.groups || []).some((g) => "error" in g || !g.ok)) problems.push("a group problem");
    verdict.textContent = problems.length ? problems.join(", ") : "all services up and ready";
    verdict.className = "verdict " + (problems.length ? "bad" : "good");
    document.getElementById("summary").replaceChildren(
      "ok ", val(["ok"], doc.ok), ", down ", val(["down"], doc.down), ", ready ",
      val(["ready"], doc.ready), ", not ready ", val(["not_ready"], doc.not_ready),
      ", version ", val(["version"], doc.version));
    document.getElementById("updated").replaceChildren("sample at ",
      val(["generated_at"], doc.generated_at, new Date(doc.generated_at * 1000).toLocaleTimeString("en-GB")));
    fill("readiness", readiness(doc));
    fill("topology", topology(doc));
    fill("buffers", buffers(doc));
    fill("consumers", consumers(doc));
    fill("groups", groups(doc));
    fill("dumps", dumps(doc));
    fill("bootstraps", bootstraps(doc));
    fill("replicators", replicators(doc));
    if (document.getElementById("all-values").open) fill("values", allValues(doc));
    document.body.setAttribute("data-generated-at", String(doc.generated_at));
  }

  function connection(ok, why) {
    const el = document.getElementById("connection");
    el.textContent = ok ? "live" : `dashboard server not answering (${why}): retrying`;
    el.className = "connection " + (ok ? "good" : "bad");
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  async function loop() {
    for (;;) {
      const query = new URLSearchParams({ since: String(state.since) });
      if (state.generated !== null) query.set("after", String(state.generated));
      try {
        const resp = await fetch("/v1/dashboard?" + query, { cache: "no-store" });
        if (!resp.ok) throw new Error("HTTP " + resp.status);
        const body = await resp.json();
        state.doc = body.status;
        state.generated = body.status.generated_at;
        mergeHistory(body.history);
        render(body.status);
        connection(true);
      } catch (err) {
        connection(false, err.message || String(err));
        await sleep(RETRY_MS);
        continue;
      }
      await sleep(MIN_GAP_MS);
    }
  }

  document.getElementById("all-values").addEventListener("toggle", () => {
    if (state.doc && document.getElementById("all-values").open) fill("values", allValues(state.doc));
  });
  loop();
})();
