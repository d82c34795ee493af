// The census page's script. The server builds every table (admission/serve/page.py); this only
// refreshes them: every pollMs it fetches the page again and moves the new tables' bodies in
// (markup the server escaped; a parsed document runs no script), keeps each pool's K-hat and K
// in the tab (sessionStorage, so a reload keeps the curve) and draws them as sparklines.
(function () {
  "use strict";
  const init = JSON.parse(document.getElementById("initial").textContent);
  const mesh = init.mesh, storeKey = "admission-history:" + mesh;
  const PARTS = ["pools", "lanes", "providers", "ceilings", "starving", "must-yield"];
  let history = {}, polls = 0, lastAt = null;
  try { history = JSON.parse(sessionStorage.getItem(storeKey) || "{}") || {}; } catch (e) { history = {}; }

  const num = (x) => (typeof x === "number" && isFinite(x)) ? x : Number(x) || 0;
  const fmt = (x) => Number.isInteger(x) ? String(x) : x.toFixed(1);
  const utc = (t) => new Date(num(t) * 1000).toISOString().slice(11, 19) + "Z";
  const arr = (x) => Array.isArray(x) ? x : [];  // cjson encodes an empty array as {}

  function remember(doc) {
    if (doc.at === lastAt) return;
    lastAt = doc.at;
    for (const p of arr(doc.pools)) {
      const h = history[p.pool] = arr(history[p.pool]);
      if (h.length && h[h.length - 1][0] >= doc.at) continue;
      h.push([doc.at, num(p.capacity), num(p.carryingCapacity)]);
      if (h.length > init.historyPoints) h.splice(0, h.length - init.historyPoints);
    }
    try { sessionStorage.setItem(storeKey, JSON.stringify(history)); } catch (e) { /* full or disabled */ }
  }
  const SVG = "http://www.w3.org/2000/svg";
  function spark(pool) {
    const W = 180, H = 36, pad = 3;
    const svg = document.createElementNS(SVG, "svg");
    for (const [k, v] of Object.entries({class: "spark", "data-pool": pool, width: W, height: H, viewBox: "0 0 " + W + " " + H,
      role: "img"})) svg.setAttribute(k, v);
    const h = arr(history[pool]);
    const last = h.length ? h[h.length - 1] : null;
    svg.setAttribute("aria-label", last ? "K-hat " + fmt(last[1]) + ", K " + fmt(last[2]) + " over " + h.length + " points" : "no history yet");
    const title = document.createElementNS(SVG, "title");
    title.textContent = last ? "K̂ " + fmt(last[1]) + "  K " + fmt(last[2]) + "  (" + h.length + " points since " + utc(h[0][0]) + ")" : "no history yet";
    svg.append(title);
    if (!h.length) return svg;
    const t0 = h[0][0], t1 = Math.max(h[h.length - 1][0], t0 + 1);
    const top = Math.max(1, ...h.map((x) => Math.max(x[1], x[2])));
    const X = (t) => pad + (W - 2 * pad) * (h.length === 1 ? 1 : (t - t0) / (t1 - t0));
    const Y = (v) => H - pad - (H - 2 * pad) * v / top;
    for (const [i, color, dash] of [[2, "#d9822b", "3 2"], [1, "#0b5cad", ""]]) {
      const pts = h.filter((x) => i === 1 || x[2] > 0).map((x) => X(x[0]).toFixed(1) + "," + Y(x[i]).toFixed(1));
      if (!pts.length) continue;
      if (pts.length === 1) pts.unshift((pad).toFixed(1) + "," + pts[0].split(",")[1]);
      const line = document.createElementNS(SVG, "polyline");
      for (const [k, v] of Object.entries({points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1.6,
        "stroke-dasharray": dash, class: i === 1 ? "k-est" : "k-cap"})) if (v !== "") line.setAttribute(k, v);
      svg.append(line);
    }
    return svg;
  }
  function sparks() {
    for (const svg of document.querySelectorAll("#pools svg.spark")) svg.replaceWith(spark(svg.getAttribute("data-pool")));
  }
  function refresh(page) {
    for (const id of PARTS) {
      const host = document.getElementById(id), fresh = page.getElementById(id);
      const target = host.tBodies ? host.tBodies[0] : host, source = fresh.tBodies ? fresh.tBodies[0] : fresh;
      target.replaceChildren(...source.childNodes);
      host.setAttribute("data-source", "script");
    }
    const up = document.getElementById("updated"), fresh = page.getElementById("updated");
    up.textContent = fresh.textContent;
    up.classList.remove("stale");
    up.setAttribute("data-at", fresh.getAttribute("data-at"));
  }
  function stale(why) {
    const up = document.getElementById("updated");
    up.textContent = why + (lastAt ? " (last " + utc(lastAt) + ")" : "");
    up.classList.add("stale");
  }
  async function poll() {
    try {
      const res = await fetch("?mesh=" + encodeURIComponent(mesh), {cache: "no-store"});
      const page = new DOMParser().parseFromString(await res.text(), "text/html");
      const up = page.getElementById("updated"), initial = page.getElementById("initial");
      if (!res.ok || !up || !initial) stale("census unavailable: HTTP " + res.status);
      else if (up.classList.contains("stale")) stale(up.textContent);
      else { remember(JSON.parse(initial.textContent).census); refresh(page); sparks(); }
    } catch (e) { stale("census unavailable: " + String(e && e.message || e)); }
    polls += 1;
    const up = document.getElementById("updated");
    up.setAttribute("data-source", "script");
    up.setAttribute("data-polls", polls);
    setTimeout(poll, init.pollMs);
  }
  if (init.census) { remember(init.census); sparks(); }
  poll();
})();
