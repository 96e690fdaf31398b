/** Every way an account-door request can be refused by auth-policy. */
export type AuthErrorCode =
  | "missing_api_key"
  | "invalid_api_key"
  | "expired_api_key"
  | "revoked_api_key"
  | "model_not_allowed"
  | "output_cap_above_policy";

/** The one error class of the auth domain. */
export class AuthError extends Error {
  constructor(
    readonly code: AuthErrorCode,
    message: string,
  ) {
    super(message);
    this.name = "AuthError";
  }
}
