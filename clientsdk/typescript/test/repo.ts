// Paths of the repository the tests read from (compiled into build/test/).

import { fileURLToPath } from "node:url";

/** The repository's root. */
export const REPO = fileURLToPath(new URL("../../../../", import.meta.url));
