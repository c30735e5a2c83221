/* qkvqa inspect: the page. Plain JS, no build step, no network: data/meta.js and data/index.js are loaded by
   index.html; a question's full trace comes from its shard, data/<a|b>/NNNNN.js, injected as a <script> when the
   question is opened (fetch() of a JSON file is refused on file://). docs/inspect.md. */
(function () {
  "use strict";
  const META = window.QKVQA_META, IX = window.QKVQA_INDEX;
  const COL = {};
  IX.columns.forEach((c, i) => { COL[c] = i; });
  const ROWS = IX.rows, CODES = IX.codes, CMP = !!META.compare;
  const RUN_A = META.runs.a, RUN_B = META.runs.b || null;
  const K_MAX = META.plots.recall.k.length;
  const shards = { a: {}, b: {} }, waiting = {};
  const $ = (id) => document.getElementById(id);

  window.QKVQA = {
    shard(key, number, rows) {
      shards[key][number] = rows;
      (waiting[key + number] || []).forEach((w) => w.resolve(rows));
      delete waiting[key + number];
    },
  };

  // ---- helpers ----------------------------------------------------------------------------------------
  function esc(value) {
    return String(value === null || value === undefined ? "" : value)
      .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function num(value, digits) {
    if (value === null || value === undefined || value === "") return "–";
    if (typeof value !== "number") return esc(value);
    return Number.isInteger(value) ? String(value) : value.toFixed(digits === undefined ? 3 : digits);
  }
  function rank(r) { return r > 0 ? String(r) : "–"; }
  function pad5(n) { return String(n).padStart(5, "0"); }
  function verdictTag(correct) {
    if (correct === -1 || correct === null || correct === undefined) return '<span class="muted">–</span>';
    return correct === 1 || correct === true ? '<span class="ok">✓ right</span>' : '<span class="bad">✗ wrong</span>';
  }
  function catTag(code) {
    if (code < 0) return '<span class="muted">–</span>';
    const name = CODES.category[code];
    return `<span class="tag ${esc(name)}">${esc(name)}</span>`;
  }
  function catName(name) { return name ? `<span class="tag ${esc(name)}">${esc(name)}</span>` : '<span class="muted">–</span>'; }
  function flag(v) { return v === 1 || v === true ? "yes" : v === 0 || v === false ? "no" : "–"; }

  // The shard of question `pos` of run `key` ("a" or "b"), loaded once, as a <script> (works on file://).
  function loadTrace(key, pos) {
    const number = Math.floor(pos / META.shard_size), offset = pos % META.shard_size;
    if (shards[key][number]) return Promise.resolve(shards[key][number][offset]);
    return new Promise((resolve, reject) => {
      const id = key + number;
      if (!waiting[id]) {
        waiting[id] = [];
        const script = document.createElement("script");
        script.src = `data/${key}/${pad5(number)}.js`;
        script.onerror = () => {
          (waiting[id] || []).forEach((w) => w.reject(new Error(`cannot load ${script.src}`)));
          delete waiting[id];
        };
        document.head.appendChild(script);
      }
      waiting[id].push({ resolve: (rows) => resolve(rows[offset]), reject });
    });
  }

  // Every case-insensitive occurrence of a gold answer in `text` wrapped in <mark>; the rest escaped.
  function highlight(text, answers) {
    const words = (answers || []).map((a) => String(a).trim()).filter((a) => a.length > 0)
      .sort((x, y) => y.length - x.length)
      .map((a) => a.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
    if (!text) return "";
    if (!words.length) return esc(text);
    const re = new RegExp(words.join("|"), "giu");
    let out = "", last = 0, m;
    while ((m = re.exec(text)) !== null) {
      if (m[0].length === 0) { re.lastIndex++; continue; }
      out += esc(text.slice(last, m.index)) + "<mark>" + esc(m[0]) + "</mark>";
      last = m.index + m[0].length;
    }
    return out + esc(text.slice(last));
  }

  // ---- header -----------------------------------------------------------------------------------------
  const HEADLINE_KEYS = ["questions", "accuracy", "skipped", "R@1 stage 1", "R@1 filtered", "R@5 filtered",
    "section R@1", "answer in context %", "R1-C", "NR-C", "judge"];
  function runHeader(run, label) {
    const h = run.headline || {};
    const chips = HEADLINE_KEYS.filter((k) => h[k] !== undefined && h[k] !== null)
      .map((k) => `<span class="metric">${esc(k)} <b>${typeof h[k] !== "number" || k === "questions" || k === "skipped" ? esc(h[k]) : h[k].toFixed(1)}</b></span>`).join("");
    const card = run.card || {};
    const what = [card.dataset, card.split, card.filter && card.filter.kind,
      card.filter && card.filter.focus ? "focus " + card.filter.focus : null,
      card.context ? `${card.context.mode} U=${card.context.U} θ=${card.context.theta}` : null].filter(Boolean).join(" · ");
    return `<div class="run"><div><b>${esc(label)}</b> <code>${esc(run.run_id)}</code> <span class="muted">${esc(what)}</span></div>
      <div class="metrics">${chips}</div>${comparable(run.comparable)}</div>`;
  }
  function comparable(line) {
    if (!line) return '<div class="comparable">no protocol card (scores.json absent)</div>';
    const cut = line.indexOf(", because ");
    if (cut < 0) return `<div class="comparable">${esc(line)}</div>`;
    return `<details class="comparable"><summary>${esc(line.slice(0, cut))} (why)</summary>${esc(line.slice(cut + 2))}</details>`;
  }
  function renderHeader() {
    document.title = `qkvqa inspect: ${RUN_A.run_id}${CMP ? " vs " + RUN_B.run_id : ""}`;
    $("header").innerHTML = `<h1>qkvqa inspect: ${esc(RUN_A.run_id)}${CMP ? " <span class=muted>vs</span> " + esc(RUN_B.run_id) : ""}</h1>
      <div class="runs">${runHeader(RUN_A, CMP ? "A" : "run")}${CMP ? runHeader(RUN_B, "B") : ""}</div>`;
  }

  // ---- the table --------------------------------------------------------------------------------------
  const state = { page: 0, size: 100, shown: [] };
  let haystack = null;
  function filters() {
    return {
      verdict: $("f-verdict").value, category: $("f-category").value, type: $("f-type").value,
      split: $("f-split").value, aic: $("f-aic").value, flip: $("f-flip").value, sort: $("f-sort").value,
      search: $("f-search").value.trim().toLowerCase(),
    };
  }
  function flipOf(r) {
    const a = r[COL.correct] === 1, b = r[COL.b_correct] === 1;
    return a && !b ? "rw" : !a && b ? "wr" : a && b ? "rr" : "ww";
  }
  function missing(r) { return r > 0 ? r : K_MAX + 1; }
  function applyFilters() {
    const f = filters();
    if (f.search && !haystack) {
      haystack = ROWS.map((r) => (r[COL.data_id] + "\n" + r[COL.question] + "\n" + r[COL.prediction]).toLowerCase());
    }
    const out = [];
    for (let i = 0; i < ROWS.length; i++) {
      const r = ROWS[i];
      if (f.verdict !== "" && r[COL.correct] !== +f.verdict) continue;
      if (f.category !== "" && r[COL.category] !== +f.category) continue;
      if (f.type !== "" && r[COL.type] !== +f.type) continue;
      if (f.split !== "" && r[COL.split] !== +f.split) continue;
      if (f.aic !== "" && r[COL.aic] !== +f.aic) continue;
      if (CMP && f.flip !== "") {
        const flip = flipOf(r);
        if (f.flip === "changed" ? flip !== "rw" && flip !== "wr" : flip !== f.flip) continue;
      }
      if (f.search && haystack[i].indexOf(f.search) < 0) continue;
      out.push(i);
    }
    const key = {
      after: (i) => missing(ROWS[i][COL.after]),
      moved: (i) => missing(ROWS[i][COL.after]) - missing(ROWS[i][COL.before]),
      delta: (i) => missing(ROWS[i][COL.b_after]) - missing(ROWS[i][COL.after]),
    }[f.sort];
    if (key) out.sort((x, y) => key(x) - key(y) || x - y);
    state.shown = out;
    state.page = 0;
    renderTable();
  }
  function tableHead() {
    const cols = ["#", "id", "question", "type", "split", "verdict", "Table 3", "answer in ctx",
      "gold rank: stage 1 → filter", "gold answer", "prediction"];
    if (CMP) cols.push("B verdict", "gold rank: A → B", "flip");
    return "<tr>" + cols.map((c) => `<th${c.startsWith("gold rank") ? ` title="${esc(RANK_LEGEND)}"` : ""}>${esc(c)}</th>`).join("") + "</tr>" +
      `<tr class="legend"><td colspan="${cols.length}" id="rank-legend">${esc(RANK_LEGEND)}</td></tr>`;
  }
  // One notation for every gold-rank cell (stage 1 → filter, and A → B in compare mode): the two ranks, then the move.
  const RANK_LEGEND = "gold rank a → b: the gold article's rank before → after; ↑n: n places higher (better), " +
    "↓n: n places lower, = unchanged; – : not in the ranked top K";
  function moveText(before, after) {
    const b = before > 0, a = after > 0;
    const move = b && a ? (after < before ? `↑${before - after}` : after > before ? `↓${after - before}` : "=")
      : a ? "↑" : b ? "↓" : "";
    const cls = move.startsWith("↑") ? "up" : move.startsWith("↓") ? "down" : "";
    return `<span class="${cls}">${rank(before)} → ${rank(after)} ${move}</span>`;
  }
  function tableRow(i) {
    const r = ROWS[i];
    const type = r[COL.type] >= 0 ? CODES.type[r[COL.type]] : "–";
    const split = r[COL.split] >= 0 ? CODES.split[r[COL.split]] : "–";
    const pred = r[COL.skipped] ? '<span class="muted">(skipped)</span>' : esc(r[COL.prediction]);
    let cells = `<td class="num">${i + 1}</td><td><code>${esc(r[COL.data_id])}</code></td><td>${esc(r[COL.question])}</td>
      <td>${esc(type)}</td><td>${esc(split)}</td><td>${verdictTag(r[COL.correct])}</td><td>${catTag(r[COL.category])}</td>
      <td>${flag(r[COL.aic])}</td><td class="num">${moveText(r[COL.before], r[COL.after])}</td><td class="gold-answer">${esc(r[COL.gold] || "")}</td><td>${pred}</td>`;
    if (CMP) {
      const flip = flipOf(r);
      const label = { rw: '<span class="bad">right → wrong</span>', wr: '<span class="ok">wrong → right</span>', rr: "", ww: "" }[flip];
      cells += `<td>${verdictTag(r[COL.b_correct])}</td><td class="num">${moveText(r[COL.after], r[COL.b_after])}</td><td>${label}</td>`;
    }
    return `<tr data-pos="${i}">${cells}</tr>`;
  }
  function renderTable() {
    const n = state.shown.length, pages = Math.max(1, Math.ceil(n / state.size));
    state.page = Math.min(state.page, pages - 1);
    const start = state.page * state.size;
    $("qtable").tBodies[0].innerHTML = state.shown.slice(start, start + state.size).map(tableRow).join("");
    $("shown-count").textContent = String(n);
    $("shown-count").dataset.shown = String(n);
    $("page-no").textContent = String(state.page + 1);
    $("page-count").textContent = String(pages);
  }
  function fillSelect(id, names) {
    const select = $(id);
    names.forEach((name, code) => {
      const option = document.createElement("option");
      option.value = String(code);
      option.textContent = name;
      select.appendChild(option);
    });
  }
  function setupTable() {
    $("qtable").tHead.innerHTML = tableHead();
    $("total-count").textContent = String(ROWS.length);
    fillSelect("f-category", CODES.category);
    fillSelect("f-type", CODES.type);
    fillSelect("f-split", CODES.split);
    if (CMP) { $("f-flip-label").hidden = false; $("f-sort-delta").hidden = false; $("tab-compare").hidden = false; }
    let timer = null;
    ["f-verdict", "f-category", "f-type", "f-split", "f-aic", "f-flip", "f-sort"].forEach((id) => $(id).addEventListener("change", applyFilters));
    $("f-search").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(applyFilters, 150); });
    $("f-reset").addEventListener("click", () => { $("filters").reset(); applyFilters(); });
    $("prev").addEventListener("click", () => { if (state.page > 0) { state.page--; renderTable(); } });
    $("next").addEventListener("click", () => { if ((state.page + 1) * state.size < state.shown.length) { state.page++; renderTable(); } });
    $("page-size").addEventListener("change", () => { state.size = +$("page-size").value; state.page = 0; renderTable(); });
    $("qtable").tBodies[0].addEventListener("click", (e) => {
      const tr = e.target.closest("tr");
      if (tr) location.hash = "#/q/" + tr.dataset.pos;
    });
  }

  // ---- one question's trace ---------------------------------------------------------------------------
  function articleTitle(t, url) {
    const found = (t.stage1 || []).find((a) => a.url === url) || ((t.filter || {}).articles || []).find((a) => a.url === url);
    return found && found.title ? found.title : url;
  }
  // The gold article(s) with each hop's evidence section (a 2_hop question has two hops: the entity in the image, then
  // the article holding the answer), and whether the gold article is also a training question's.
  function goldText(t) {
    const g = t.gold || {};
    const hops = g.hops && g.hops.length ? g.hops : (g.urls || []).map((u, i) => ({url: u, section_index: i ? null : g.section_index}));
    const one = (h) => esc(h.title || articleTitle(t, h.url)) + (h.section_index !== null && h.section_index !== undefined
      ? ` · evidence section ${h.section_index}${h.section_title ? ` “${esc(h.section_title)}”` : ""}` : "");
    const text = hops.length > 1 ? hops.map((h, i) => `hop ${i + 1}: ${one(h)}`).join(" → ") : hops.map(one).join("") || "–";
    const seen = g.url_used_in_train === true ? " · seen in training" : g.url_used_in_train === false ? " · unseen in training" : "";
    return `gold article${hops.length > 1 ? "s" : ""}: ${text}${seen}`;
  }
  // "url#section" of each hop's gold evidence section (a 2_hop question has one per hop)
  function evidenceSections(t) {
    const g = t.gold || {};
    const hops = g.hops && g.hops.length ? g.hops : (g.urls || []).slice(0, 1).map((u) => ({url: u, section_index: g.section_index}));
    return new Set(hops.filter((h) => h.section_index !== null && h.section_index !== undefined).map((h) => h.url + "#" + h.section_index));
  }
  function renderTrace(t, label) {
    const gold = new Set((t.gold || {}).urls || []);
    const answers = (t.gold || {}).answers || [];
    const v = t.verdict || {}, gr = t.gold_rank || {};
    const img = t._thumb ? `<img id="${label === "B" ? "q-image-b" : "q-image"}" class="q-image" src="thumbs/${esc(t._thumb)}" alt="query image">`
      : `<div class="noimg">${t.image ? "image unreadable" : "no query image"}</div>`;
    let h = `<div class="trace">${label ? `<h2>${esc(label)}: <code>${esc(label === "B" ? RUN_B.run_id : RUN_A.run_id)}</code></h2>` : ""}
      <div class="qhead">${img}<div>
        <div class="muted"><code>${esc(t.data_id)}</code> · ${esc(t.dataset)} · ${esc(t.split)} · ${esc(t.question_type || "–")}</div>
        <div class="question">${esc(t.question)}</div>
        <div>gold answers: <b>${answers.map(esc).join("</b> | <b>") || "–"}</b></div>
        <div class="muted" id="${label === "B" ? "q-gold-b" : "q-gold"}">${goldText(t)}</div>
        <div>Table 3: ${catName(t.category)} · gold rank ${moveText(gr.before || 0, gr.after || 0)} · answer in context: ${flag(t.answer_in_context)}</div>
      </div></div>`;
    h += `<h3>Prediction</h3>`;
    if (t.skipped) h += `<p class="bad">skipped: ${esc(t.skipped)}</p>`;
    h += `<p class="prediction">${esc(t.prediction === null ? "(none)" : t.prediction)} &nbsp; ${verdictTag(v.correct)} <span class="muted">score ${num(v.score)}</span></p>`;
    h += `<table class="refs"><tr><th>reference</th><th>EM</th><th>BEM</th></tr>` + (v.references || []).map((r) =>
      `<tr><td>${esc(r.answer)}</td><td>${r.em === null || r.em === undefined ? "–" : r.em ? '<span class="ok">✓</span>' : "✗"}</td><td class="num">${num(r.bem)}</td></tr>`).join("") + "</table>";
    h += `<h3>Stage 1 (top ${(t.stage1 || []).length})</h3><table class="stage1"><tr><th>rank</th><th>article</th><th class="num">sim</th></tr>` +
      (t.stage1 || []).map((a, i) => `<tr class="${gold.has(a.url) ? "gold" : ""}"><td class="num">${i + 1}</td><td>${esc(a.title || a.url)}</td><td class="num">${num(a.sim)}</td></tr>`).join("") + "</table>";
    const f = t.filter || { articles: [] };
    const goldArticle = (f.articles || []).findIndex((a) => gold.has(a.url));
    h += `<h3>Filter: ${esc(f.name || "–")}${f.alpha !== null && f.alpha !== undefined ? ` (α = ${num(f.alpha, 2)})` : ""}</h3>`;
    h += goldArticle >= 0 ? `<p>gold article: stage-1 rank ${rank(f.articles[goldArticle].stage1_rank || 0)} → rank ${goldArticle + 1} after the filter</p>`
      : `<p class="muted">the gold article is not in the filtered list</p>`;
    h += `<table class="filter"><tr><th>rank</th><th>stage 1</th><th>article</th><th class="num">sim</th><th class="num">QFF</th><th class="num">fused</th><th>best sections</th></tr>` +
      (f.articles || []).map((a, i) => {
        const s1 = a.stage1_rank || 0;
        const move = s1 > 0 ? (s1 > i + 1 ? `<span class="up">↑${s1 - i - 1}</span>` : s1 < i + 1 ? `<span class="down">↓${i + 1 - s1}</span>` : "=") : "";
        const secs = (a.sections || []).slice().sort((x, y) => (y.score || 0) - (x.score || 0)).slice(0, 3)
          .map((s) => `§${s.index} ${esc(s.title || "")} <span class="muted">${num(s.score, 2)}</span>`).join("; ");
        return `<tr class="${gold.has(a.url) ? "gold" : ""}"><td class="num">${i + 1}</td><td class="num">${rank(s1)} ${move}</td><td>${esc(a.title || a.url)}</td>
          <td class="num">${num(a.sim_ret)}</td><td class="num">${num(a.qff)}</td><td class="num">${num(a.fused)}</td><td class="chunktext">${secs}</td></tr>`;
      }).join("") + "</table>";
    const c = t.cda;
    if (c) {
      h += `<h3>CDA: ${esc(c.mode)} · U = ${num(c.U)} · θ = ${num(c.theta, 2)}</h3><p>kept: ${(c.kept || []).map((u) =>
        gold.has(u) ? `<b class="ok">★ ${esc(articleTitle(t, u))}</b>` : esc(articleTitle(t, u))).join(", ") || "–"}</p>`;
      const evidence = evidenceSections(t);
      h += `<p class="muted">${num(c.n_chunks)} chunks scored; shown: every selected one and the best-scored dropped ones (text up to the trace's cap). ★ gold article · <span class="evidence">evidence</span> the gold evidence section</p>`;
      h += `<table class="chunks"><tr><th>article</th><th>section</th><th>chunk</th><th class="num">tokens</th><th class="num">score</th><th>selected</th><th>text</th></tr>` +
        (c.chunks || []).map((k) => {
          const ev = evidence.has(k.url + "#" + k.section_index);
          return `<tr class="${k.selected ? "selected" : "dropped"}${ev ? " evidence-row" : ""}"><td>${gold.has(k.url) ? "★ " : ""}${esc(articleTitle(t, k.url))}</td><td class="num">${num(k.section_index)}${ev ? ' <span class="evidence">evidence</span>' : ""}</td>
          <td class="num">${num(k.chunk_index)}</td><td class="num">${num(k.tokens)}</td><td class="num">${num(k.score)}</td><td>${k.selected ? '<span class="ok">✓</span>' : '<span class="muted">dropped</span>'}</td>
          <td class="chunktext">${k.text ? highlight(k.text, answers) : ""}</td></tr>`;
        }).join("") + "</table>";
    } else {
      h += `<h3>CDA</h3><p class="muted">no CDA in this run (the context came from another selector)</p>`;
    }
    h += `<h3>Context given to the generator</h3>`;
    h += t.context ? `<div class="context" id="${label === "B" ? "context-b" : "context"}">${highlight(t.context, answers)}</div>` : `<p class="muted">no context</p>`;
    const sec = t.seconds || {};
    h += `<p class="muted">seconds: ${Object.keys(sec).map((k) => `${esc(k)} ${num(sec[k], 4)}`).join(" · ")}</p></div>`;
    return h;
  }
  function showQuestion(pos) {
    const view = $("view-question");
    if (!(pos >= 0 && pos < ROWS.length)) { view.innerHTML = `<p class="bad">no question ${esc(pos)}</p>`; return; }
    view.innerHTML = `<a class="back" href="#/">← back to the table</a><p class="muted">loading…</p>`;
    const nav = `<a class="back" href="#/">← back to the table</a> &nbsp; ${pos > 0 ? `<a href="#/q/${pos - 1}">← previous</a>` : ""} &nbsp; ${pos + 1 < ROWS.length ? `<a href="#/q/${pos + 1}">next →</a>` : ""}`;
    const jobs = [loadTrace("a", pos)];
    if (CMP) jobs.push(loadTrace("b", ROWS[pos][COL.b_pos]));
    Promise.all(jobs).then((traces) => {
      if (location.hash !== "#/q/" + pos) return;
      view.innerHTML = nav + (CMP ? `<div class="pair"><div>${renderTrace(traces[0], "A")}</div><div>${renderTrace(traces[1], "B")}</div></div>`
        : renderTrace(traces[0], ""));
      view.dataset.loaded = String(pos);
    }).catch((e) => { view.innerHTML = nav + `<p class="bad">${esc(e.message)}</p>`; });
  }

  // ---- compare ----------------------------------------------------------------------------------------
  function renderCompare() {
    const view = $("view-compare");
    const counts = { rw: 0, wr: 0, rr: 0, ww: 0 };
    let better = 0, worse = 0, same = 0, enter1 = 0, leave1 = 0;
    const deltas = {};
    ROWS.forEach((r) => {
      counts[flipOf(r)]++;
      const a = missing(r[COL.after]), b = missing(r[COL.b_after]);
      if (b < a) better++; else if (b > a) worse++; else same++;
      if (a !== 1 && b === 1) enter1++;
      if (a === 1 && b !== 1) leave1++;
      if (a !== b) deltas[b - a] = (deltas[b - a] || 0) + 1;
    });
    const card = (id, n, text) => `<div class="card"><div class="big" id="${id}">${n}</div><div>${text}</div></div>`;
    let h = `<h2>A <code>${esc(RUN_A.run_id)}</code> → B <code>${esc(RUN_B.run_id)}</code></h2>
      <div class="cards">${card("flip-rw", counts.rw, '<span class="bad">right → wrong</span> (right in A, wrong in B)')}
      ${card("flip-wr", counts.wr, '<span class="ok">wrong → right</span> (wrong in A, right in B)')}
      ${card("flip-rr", counts.rr, "right in both")}${card("flip-ww", counts.ww, "wrong in both")}
      ${card("correct-a", counts.rw + counts.rr, "right in A")}${card("correct-b", counts.wr + counts.rr, "right in B")}</div>
      <h3>Gold article rank after the filter, B against A</h3>
      <div class="cards">${card("rank-better", better, "ranked higher in B")}${card("rank-worse", worse, "ranked lower in B")}
      ${card("rank-same", same, "same rank")}${card("rank-enter1", enter1, "reach rank 1 in B")}${card("rank-leave1", leave1, "lose rank 1 in B")}</div>`;
    h += `<div class="plot">${deltaChart(deltas)}</div>`;
    const list = (kind, title) => {
      const ids = [];
      ROWS.forEach((r, i) => { if (flipOf(r) === kind) ids.push(i); });
      const shown = ids.slice(0, 200);
      return `<h3>${title} (${ids.length}) <a href="#/" data-flip="${kind}">show in the table</a></h3>` + (shown.length ?
        `<table class="fliplist"><tr><th>id</th><th>question</th><th>A prediction</th><th>B prediction</th><th>gold rank A → B</th></tr>` +
        shown.map((i) => { const r = ROWS[i]; return `<tr><td><a href="#/q/${i}"><code>${esc(r[COL.data_id])}</code></a></td><td>${esc(r[COL.question])}</td>
          <td>${esc(r[COL.prediction])}</td><td>${esc(r[COL.b_prediction])}</td><td class="num">${moveText(r[COL.after], r[COL.b_after])}</td></tr>`; }).join("") + "</table>"
        + (ids.length > shown.length ? `<p class="muted">the first ${shown.length}; all of them in the table</p>` : "") : '<p class="muted">none</p>');
    };
    h += list("rw", "Right in A, wrong in B") + list("wr", "Wrong in A, right in B");
    view.innerHTML = h;
    view.querySelectorAll("a[data-flip]").forEach((a) => a.addEventListener("click", () => {
      $("filters").reset();
      $("f-flip").value = a.dataset.flip;
      applyFilters();
    }));
  }

  // ---- plots (inline SVG) -----------------------------------------------------------------------------
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
  function axes(w, hgt, m, xs, ymax, xlabel, ylabel, xfmt) {
    let s = `<line x1="${m.l}" y1="${hgt - m.b}" x2="${w - m.r}" y2="${hgt - m.b}" stroke="#333"/><line x1="${m.l}" y1="${m.t}" x2="${m.l}" y2="${hgt - m.b}" stroke="#333"/>`;
    for (let y = 0; y <= ymax; y += ymax / 5) {
      const py = hgt - m.b - (y / ymax) * (hgt - m.t - m.b);
      s += `<line x1="${m.l}" y1="${py}" x2="${w - m.r}" y2="${py}" stroke="#eee"/><text x="${m.l - 6}" y="${py + 4}" text-anchor="end">${Math.round(y)}</text>`;
    }
    xs.forEach((x) => { s += `<text x="${x.px}" y="${hgt - m.b + 14}" text-anchor="middle">${esc(xfmt ? xfmt(x.v) : x.v)}</text>`; });
    s += `<text x="${(m.l + w - m.r) / 2}" y="${hgt - 4}" text-anchor="middle">${esc(xlabel)}</text>`;
    s += `<text transform="translate(12 ${(m.t + hgt - m.b) / 2}) rotate(-90)" text-anchor="middle">${esc(ylabel)}</text>`;
    return s;
  }
  function legend(names, x, y) {
    return names.map((n, i) => `<rect x="${x}" y="${y + i * 16}" width="12" height="3" fill="${COLORS[i % COLORS.length]}"/><text x="${x + 16}" y="${y + i * 16 + 5}">${esc(n)}</text>`).join("");
  }
  function recallChart() {
    const R = META.plots.recall, w = 760, hgt = 320, m = { l: 48, r: 250, t: 12, b: 40 };
    const series = [[`A ${RUN_A.run_id}: stage 1`, R.a_before, 0, true], [`A ${RUN_A.run_id}: after filter`, R.a_after, 0, false]];
    if (CMP) series.push([`B ${RUN_B.run_id}: stage 1`, R.b_before, 1, true], [`B ${RUN_B.run_id}: after filter`, R.b_after, 1, false]);
    const px = (k) => m.l + (K_MAX === 1 ? 0.5 : (k - 1) / (K_MAX - 1)) * (w - m.l - m.r);
    const py = (v) => hgt - m.b - (v / 100) * (hgt - m.t - m.b);
    const ticks = R.k.filter((k) => k === 1 || k % 5 === 0 || K_MAX <= 10).map((k) => ({ v: k, px: px(k) }));
    let s = axes(w, hgt, m, ticks, 100, "K", "Recall@K (%)");
    series.forEach(([name, ys, c, dashed], i) => {
      const pts = ys.map((v, j) => `${px(R.k[j])},${py(v)}`).join(" ");
      s += `<polyline fill="none" stroke="${COLORS[c]}" stroke-width="${dashed ? 1.5 : 2.5}" ${dashed ? 'stroke-dasharray="5 3"' : ""} points="${pts}"/>`;
      ys.forEach((v, j) => { s += `<circle cx="${px(R.k[j])}" cy="${py(v)}" r="2.5" fill="${COLORS[c]}"><title>${esc(name)} R@${R.k[j]} = ${v.toFixed(1)}%</title></circle>`; });
      const y = m.t + 10 + i * 18, x = w - m.r + 10;
      s += `<line x1="${x}" y1="${y}" x2="${x + 22}" y2="${y}" stroke="${COLORS[c]}" stroke-width="2" ${dashed ? 'stroke-dasharray="5 3"' : ""}/><text x="${x + 28}" y="${y + 4}">${esc(name)}</text>`;
    });
    return `<svg id="plot-recall" width="${w}" height="${hgt}" viewBox="0 0 ${w} ${hgt}" role="img">${s}</svg>`;
  }
  function accuracyChart() {
    const A = META.plots.accuracy_by_type, runs = CMP ? ["a", "b"] : ["a"];
    const types = [...new Set(runs.flatMap((k) => Object.keys(A[k])))].sort();
    const w = Math.max(560, 250 + types.length * 150), hgt = 300, m = { l: 48, r: 200, t: 16, b: 40 };
    const band = (w - m.l - m.r) / Math.max(types.length, 1), bw = band * 0.7 / runs.length;
    const py = (v) => hgt - m.b - (v / 100) * (hgt - m.t - m.b);
    let s = axes(w, hgt, m, types.map((t, i) => ({ v: `${t} (n=${(A.a[t] || {}).n || 0})`, px: m.l + band * (i + 0.5) })), 100, "question type", "accuracy (%)");
    types.forEach((t, i) => runs.forEach((k, j) => {
      const e = A[k][t]; if (!e) return;
      const x = m.l + band * i + band * 0.15 + j * bw;
      s += `<rect x="${x}" y="${py(e.accuracy)}" width="${bw - 2}" height="${hgt - m.b - py(e.accuracy)}" fill="${COLORS[j]}"><title>${esc(t)}: ${e.correct}/${e.n} = ${e.accuracy.toFixed(1)}%</title></rect>`;
      s += `<text x="${x + bw / 2}" y="${py(e.accuracy) - 3}" text-anchor="middle">${e.accuracy.toFixed(1)}</text>`;
    }));
    s += legend(runs.map((k) => `${k.toUpperCase()} ${META.runs[k].run_id}`), w - m.r + 10, m.t + 10);
    return `<svg id="plot-accuracy" width="${w}" height="${hgt}" viewBox="0 0 ${w} ${hgt}" role="img">${s}</svg>`;
  }
  function deltaChart(deltas) {
    const keys = Object.keys(deltas).map(Number).sort((x, y) => x - y);
    if (!keys.length) return '<p class="muted">no question changed its gold rank</p>';
    const w = Math.max(520, 80 + keys.length * 28), hgt = 220, m = { l: 48, r: 20, t: 12, b: 40 };
    const ymax = Math.max(...keys.map((k) => deltas[k]));
    const step = Math.max(1, Math.ceil(ymax / 5));
    const top = step * 5, band = (w - m.l - m.r) / keys.length;
    const py = (v) => hgt - m.b - (v / top) * (hgt - m.t - m.b);
    let s = axes(w, hgt, m, keys.map((k, i) => ({ v: k > 0 ? "+" + k : k, px: m.l + band * (i + 0.5) })), top,
      `gold rank B − A (negative: higher in B; absent = ${K_MAX + 1})`, "questions");
    keys.forEach((k, i) => {
      s += `<rect x="${m.l + band * i + 2}" y="${py(deltas[k])}" width="${band - 4}" height="${hgt - m.b - py(deltas[k])}" fill="${k < 0 ? "#2ca02c" : "#d62728"}"><title>${k}: ${deltas[k]}</title></rect>`;
    });
    return `<svg id="plot-delta" width="${w}" height="${hgt}" viewBox="0 0 ${w} ${hgt}" role="img">${s}</svg>`;
  }
  function renderPlots() {
    const R = META.plots.recall;
    $("view-plots").innerHTML = `<h3>Recall@K before and after the filter</h3><p class="muted">From the traces' gold ranks, over ${R.n} questions
      with a gold article (E-VQA two-hop rows left out, as Table 4); an unanswered question counts as a miss.</p>
      <div class="plot">${recallChart()}</div><h3>Accuracy per question type</h3><div class="plot">${accuracyChart()}</div>`;
  }

  // ---- protocol card ----------------------------------------------------------------------------------
  function kv(obj) {
    if (obj === null || obj === undefined) return "–";
    if (typeof obj !== "object") return esc(obj);
    if (Array.isArray(obj)) return obj.map(kv).join("; ") || "–";
    return `<dl class="card-kv">${Object.keys(obj).map((k) => `<dt>${esc(k)}</dt><dd>${kv(obj[k])}</dd>`).join("")}</dl>`;
  }
  function renderRun() {
    const one = (run, label) => `<h2>${esc(label)} <code>${esc(run.run_id)}</code></h2><p><b>${esc(run.comparable || "")}</b></p>
      <p class="muted">${esc(run.run_dir)} · ${esc(run.state || "")} ${esc(run.finished_at || "")}</p>
      <h3>Headline metrics</h3>${kv(run.headline)}<h3>Protocol card</h3>${kv(run.card)}`;
    $("view-run").innerHTML = `<div class="${CMP ? "pair" : ""}"><div>${one(RUN_A, CMP ? "A" : "run")}</div>${CMP ? `<div>${one(RUN_B, "B")}</div>` : ""}</div>`;
  }

  // ---- routing ----------------------------------------------------------------------------------------
  const rendered = {};
  function route() {
    const hash = location.hash || "#/";
    let tab = "table";
    ["table", "question", "compare", "plots", "run"].forEach((v) => { $("view-" + v).hidden = true; });
    const q = hash.match(/^#\/q\/(\d+)$/);
    if (q) { tab = "question"; showQuestion(+q[1]); }
    else if (hash === "#/compare" && CMP) { tab = "compare"; if (!rendered.compare) { renderCompare(); rendered.compare = true; } }
    else if (hash === "#/plots") { tab = "plots"; if (!rendered.plots) { renderPlots(); rendered.plots = true; } }
    else if (hash === "#/run") { tab = "run"; if (!rendered.run) { renderRun(); rendered.run = true; } }
    $("view-" + tab).hidden = false;
    document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.tab === tab || (tab === "question" && a.dataset.tab === "table")));
    document.body.dataset.view = tab;
  }

  renderHeader();
  setupTable();
  applyFilters();
  window.QKVQA_READY_MS = performance.now();       // the first page of the table is in the DOM (bench/inspect_load.py)
  document.body.dataset.ready = "1";
  window.addEventListener("hashchange", route);
  route();
})();
