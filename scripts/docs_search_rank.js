// The pages the built site's search box lists first, by the site's own search worker (Material's lunr
// set-up: its tokenizer, field boosts and post-query boosts), run under Node instead of a browser.
//
//     node scripts/docs_search_rank.js site/assets/javascripts/workers/search.*.min.js site/search/search_index.json QUERY...
//
// Prints one JSON object: query -> the pages in the order the search box shows them.
const fs = require("fs");
const vm = require("vm");

const [workerFile, indexFile, ...queries] = process.argv.slice(2);
let answer;
const worker = { console, setTimeout, Promise, URL, TextEncoder, Uint16Array, Map, Set };
worker.self = worker;
worker.addEventListener = (type, listener) => { worker.listener = listener; };
worker.postMessage = (message) => answer(message);
vm.createContext(worker);
vm.runInContext(fs.readFileSync(workerFile, "utf8"), worker);

// the worker's messages: 0 = set up (the index, as the page sends it), 2 = query; it answers each one
const ask = (message) => new Promise((resolve) => { answer = resolve; worker.listener({ data: message }); });

(async () => {
  const index = JSON.parse(fs.readFileSync(indexFile, "utf8"));
  await ask({ type: 0, data: { ...index, options: { suggest: false } } });
  const pages = {};
  for (const query of queries) {
    const result = await ask({ type: 2, data: query });
    pages[query] = result.data.items.map((group) => group[0].location.split("#")[0]);
  }
  console.log(JSON.stringify(pages));
})();
