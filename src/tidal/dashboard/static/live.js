// tidal dashboard: reload a live run's metrics fragment every 3 s (the page works without it).
(function () {
  var box = document.getElementById("live");
  if (!box || box.dataset.live !== "1") return;
  function reload() {
    fetch(box.dataset.src, {cache: "no-store"}).then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) { if (html !== null) { box.innerHTML = html; box.dataset.reloads = String(Number(box.dataset.reloads || 0) + 1); } })
      .catch(function () {});
  }
  setInterval(reload, 3000);
})();
