import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

/** The server extension's base URL ({base_url}gpuprof/api/), JupyterHub's base_url included. */
export function apiUrl(endpoint: string, query?: Record<string, string | undefined>): string {
  const settings = ServerConnection.makeSettings();
  let url = URLExt.join(settings.baseUrl, 'gpuprof', 'api', endpoint);
  const params = Object.entries(query ?? {}).filter(([, v]) => v !== undefined && v !== '');
  if (params.length) {
    url += '?' + params.map(([k, v]) => `${encodeURIComponent(k)}=${encodeURIComponent(v as string)}`).join('&');
  }
  return url;
}

/**
 * The one fetch helper: authenticated through ServerConnection (token, XSRF header on POST);
 * an error answer becomes a ResponseError carrying the server's message.
 */
export async function requestAPI<T>(
  endpoint: string,
  query?: Record<string, string | undefined>,
  init: RequestInit = {}
): Promise<T> {
  return (await send<T>(endpoint, query, init)).data as T;
}

/**
 * A GET answered "not modified" when the server's ETag is still ``etag``: null then (no body
 * travelled), else the body and its ETag, to send on the next poll.
 */
export async function requestIfChanged<T>(
  endpoint: string,
  query: Record<string, string | undefined>,
  etag: string
): Promise<{ data: T; etag: string } | null> {
  const headers = etag ? { 'If-None-Match': etag } : undefined;
  const answer = await send<T>(endpoint, query, { headers, cache: 'no-store' });
  return answer.status === 304 ? null : { data: answer.data as T, etag: answer.etag };
}

async function send<T>(
  endpoint: string,
  query: Record<string, string | undefined> | undefined,
  init: RequestInit
): Promise<{ status: number; etag: string; data: T | null }> {
  const settings = ServerConnection.makeSettings();
  const url = apiUrl(endpoint, query);
  let response: Response;
  try {
    response = await ServerConnection.makeRequest(url, init, settings);
  } catch (error) {
    throw new ServerConnection.NetworkError(error as TypeError);
  }
  const etag = response.headers.get('ETag') ?? '';
  if (response.status === 304) {
    return { status: 304, etag, data: null };
  }
  const text = await response.text();
  let data: any = text;
  if (text.length > 0) {
    try {
      data = JSON.parse(text);
    } catch {
      // not JSON: keep the text (the report endpoint answers HTML)
    }
  }
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, (data && data.message) || text);
  }
  return { status: response.status, etag, data: data as T };
}
