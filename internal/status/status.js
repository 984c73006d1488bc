// Every few seconds, fetch this page's live part again and swap it in, so
// the page updates in place: no flicker, the scroll position and which
// <details> are open kept. When a fetch fails the page says since when it is stale.
(function () {
  "use strict";
  var body = document.body;
  var every = (parseInt(body.getAttribute("data-refresh"), 10) || 5) * 1000;
  var live = document.getElementById("live");
  var stale = document.getElementById("stale");
  var url = location.pathname + location.search + (location.search ? "&" : "?") + "fragment=1";
  var refreshed = 0;
  var form = document.getElementById("filter");
  if (form) {
    form.addEventListener("change", function () { form.submit(); });
  }
  function tick() {
    fetch(url, { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        return r.text();
      })
      .then(function (text) {
        var open = {};
        live.querySelectorAll("details[id]").forEach(function (d) { open[d.id] = d.open; });
        live.innerHTML = text;
        live.querySelectorAll("details[id]").forEach(function (d) {
          if (Object.prototype.hasOwnProperty.call(open, d.id)) { d.open = open[d.id]; }
        });
        stale.hidden = true;
        body.setAttribute("data-refreshed", String(++refreshed));
      })
      .catch(function (err) {
        if (stale.hidden) {
          stale.textContent = "Not updated since " + new Date().toISOString().slice(11, 19) +
            " UTC: the sidecar does not answer (" + err.message + "). Still trying.";
          stale.hidden = false;
        }
      })
      .finally(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
