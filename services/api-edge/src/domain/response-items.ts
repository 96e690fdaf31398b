/**
 * An output item of a Responses answer kept so a later request can name it by id
 * (`{ "type": "item_reference", "id": "msg_…" }`): the assistant's message, and the account
 * whose answer it was (no other account reads it).
 */
export interface StoredResponseItem {
  account: string;
  role: "assistant";
  text: string;
}

/**
 * Where Responses output items live: Redis shared by every api-edge replica, or memory in the
 * all-in-one process. Each item lapses after the store's time to live.
 */
export interface ResponseItemStore {
  /** Keeps `item` under `id` for the store's time to live. */
  put(id: string, item: StoredResponseItem): Promise<void>;
  /** The items stored under `ids`, in order; undefined for one unknown or expired. */
  getMany(ids: readonly string[]): Promise<(StoredResponseItem | undefined)[]>;
}

/** How long an output item is kept by default (docs/configuration.md): 24 h. */
export const RESPONSE_ITEMS_TTL_MS = 24 * 60 * 60 * 1000;
